"""llmkit's math verifier against math-verify 0.9 on generated answer pairs.

    .venv/bin/python bench/math_verify.py [--pairs 500] [--seed 0] [--runs 3]

The pairs come from tests/rewards/math_pairs.py (fixed seed): a gold answer and a predicted text
in another form of the same answer or a different answer, English or Chinese (Chinese phrasing,
full-width digits). Three verdicts per pair:
  llmkit     answers_equal(gold, predicted) on the texts as generated;
  reference  math-verify on the canonical pair: both answers in LaTeX between $…$, the input
             math-verify documents (verify(parse(gold), parse(predicted)));
  raw        math-verify on the texts as generated.
It prints the agreement of llmkit with the reference (the acceptance figure) and with raw, each
side's accuracy against the truth known by construction, every disagreement, and the time per
pair of each side (median of --runs, after a warm-up pass).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"] + [str(REPO)]

from math_verify import parse, verify  # noqa: E402

from llmkit.rewards.math import answers_equal  # noqa: E402
from tests.rewards.math_pairs import answer_pairs  # noqa: E402


def math_verify_equal(gold: str, predicted: str) -> bool:
    return bool(verify(parse(gold), parse(predicted)))


def timed(fn, pairs, runs: int) -> tuple[list[bool], list[float]]:
    verdicts = [fn(p) for p in pairs]  # warm-up: parsers and caches loaded
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for p in pairs:
            fn(p)
        times.append((time.perf_counter() - start) / len(pairs) * 1e3)
    return verdicts, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    pairs = answer_pairs(args.pairs, args.seed)
    ours, ours_ms = timed(lambda p: answers_equal(p.gold, p.predicted), pairs, args.runs)
    reference, ref_ms = timed(lambda p: math_verify_equal(p.gold_canonical, p.predicted_canonical),
                              pairs, args.runs)
    raw, raw_ms = timed(lambda p: math_verify_equal(p.gold, p.predicted), pairs, args.runs)
    n = len(pairs)

    def share(xs, ys, subset=None):
        idx = [i for i in range(n) if subset is None or subset(pairs[i])]
        return sum(xs[i] == ys[i] for i in idx), len(idx)

    truth = [p.equal for p in pairs]
    print(f"{n} pairs (seed {args.seed}): {sum(truth)} equal, "
          f"{sum(p.lang == 'zh' for p in pairs)} Chinese")
    for label, other in (("reference (canonical)", reference), ("math-verify raw", raw), ("truth", truth)):
        rows = [share(ours, other), share(ours, other, lambda p: p.lang == "en"),
                share(ours, other, lambda p: p.lang == "zh")]
        print(f"llmkit vs {label:22s} " + "  ".join(
            f"{name} {a}/{b} = {a / b:.1%}" for name, (a, b) in zip(("all", "en", "zh"), rows)))
    for label, side in (("reference", reference), ("raw", raw)):
        a, b = share(side, truth)
        print(f"{label} vs truth: {a}/{b} = {a / b:.1%}")
    print("\ndisagreements with the reference (gold | predicted | llmkit | reference | truth):")
    for i, p in enumerate(pairs):
        if ours[i] != reference[i]:
            print(f"  [{p.kind}/{p.lang}] {p.gold!r} | {p.predicted!r} | {ours[i]} | {reference[i]} | {p.equal}")
    print("\nraw math-verify wrong where llmkit is right, by kind/lang:")
    missed: dict[str, int] = {}
    for i, p in enumerate(pairs):
        if raw[i] != p.equal and ours[i] == p.equal:
            missed[f"{p.kind}/{p.lang}"] = missed.get(f"{p.kind}/{p.lang}", 0) + 1
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(missed.items())))
    for label, ms in (("llmkit", ours_ms), ("reference", ref_ms), ("raw", raw_ms)) if args.runs else ():
        print(f"{label}: {statistics.median(ms):.2f} ms/pair (runs {', '.join(f'{m:.2f}' for m in ms)})")


if __name__ == "__main__":
    main()
