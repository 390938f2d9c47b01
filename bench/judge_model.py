"""The model judge against the demo's scripted human rater: agreement, Cohen's kappa, position bias.

Prepares the demo's SFT-vs-DPO session as `bench/judge_demo.py` does (`llmkit judge --prepare
--from sft,dpo --prompts prompts_eval --set max_prompts=30`), judges it with judge_demo's scripted
rater (`checker`: the side whose reply `llmkit.rewards.verify.exact_match` finds right, a tie when
both or neither are) written straight into the journal (the page's own route, without a browser),
then with each `--judges` run through `llmkit judge --model RUN` (both orders, combine=agree), and
prints per judge: its choices, agreement and kappa with the rater, position-bias rate, the share of
its side verdicts that went to the reply shown first, and the same figures with the two orders'
probabilities averaged (combine=mean, recomputed from the probabilities the journal records).
Then exports the model's judgements alone (`--set raters=model:RUN`) as the preference pairs
`llmkit dpo` reads, and renders `llmkit report` of the export of everything.

    python bench/judge_model.py -w WS [--judges smollm2,dpo] [--judge-workspace /tmp/smolws]
        [--from sft,dpo] [--max-prompts 30]

WS is written into (a session, its journal, exports): use a copy of a demo workspace. A judge
found in --judge-workspace and not in WS is linked into WS (read only: loading only reads it).
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)  # the repository root, not bench/, on the path

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from llmkit.data.io import read_table  # noqa: E402
from llmkit.judge.agreement import compare, judge_summary  # noqa: E402
from llmkit.judge.journal import JOURNAL_FILE, Journal, first_judgements, read_journal  # noqa: E402
from llmkit.judge.model_judge import combine_orders  # noqa: E402
from llmkit.judge.session import read_items  # noqa: E402
from llmkit.rewards.verify import exact_match  # noqa: E402


def llmkit(ws: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "llmkit", *args, "-w", str(ws)], check=True,
                          stdout=subprocess.PIPE, text=True)
    return done.stdout


def scripted_rater(session: Path, answers: dict[str, str], rater: str = "checker") -> int:
    """judge_demo's rater: left or right for the reply exact match finds right, a tie when both
    or neither are. Returns the number of new judgements."""
    journal = Journal(session / JOURNAL_FILE)
    new = 0
    try:
        for item in read_items(session):
            right = {side: exact_match(item[side], answers[item["prompt"]]) for side in ("left", "right")}
            choice = "tie" if right["left"] == right["right"] else "left" if right["left"] else "right"
            _, repeated = journal.append({"rater": rater, "item": item["id"], "choice": choice,
                                          "left_model": item["left_model"], "right_model": item["right_model"]})
            new += not repeated
    finally:
        journal.close()
    return new


def mean_choices(records: list[dict]) -> dict[str, str]:
    """item -> the verdict of the two orders' probabilities averaged (combine=mean)."""
    out = {}
    for r in records:
        first, second = r["model_judge"]["probs"]
        choice = combine_orders(first, second, "mean")[0]
        out[r["item"]] = {"a": "left", "b": "right", "tie": "tie"}[choice]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-w", "--workspace", type=Path)
    ap.add_argument("--judges", default="smollm2,dpo")
    ap.add_argument("--judge-workspace", type=Path, default=Path("/tmp/smolws"))
    ap.add_argument("--from", dest="models", default="sft,dpo")
    ap.add_argument("--prompts", default="prompts_eval")
    ap.add_argument("--max-prompts", type=int, default=30)
    ap.add_argument("--session", default="judged")
    args = ap.parse_args()
    if not args.workspace:
        return print("skip: needs -w, a copy of a demo workspace with its sft and dpo runs (make demo)")
    ws, session = args.workspace, args.session
    answers = {r["prompt"]: r["answer"] for r in read_table(ws / args.prompts).to_pylist()}
    llmkit(ws, "judge", "--prepare", "--from", args.models, "--prompts", args.prompts, "--out", session,
           "--set", f"max_prompts={args.max_prompts}")
    print(f"scripted rater: {scripted_rater(ws / session, answers)} new judgements")

    seconds = {}
    for judge in args.judges.split(","):
        if not (ws / judge).exists() and (args.judge_workspace / judge).exists():
            os.symlink(args.judge_workspace / judge, ws / judge)
        started = time.monotonic()
        print(llmkit(ws, "judge", "--model", judge, "--in", session))
        seconds[judge] = time.monotonic() - started

    judgements, _ = first_judgements(read_journal(ws / session / JOURNAL_FILE))
    summary = judge_summary(judgements)
    human = {j["item"]: j["choice"] for j in judgements if j["rater"] == "checker"}
    print(f"\nload: {os.getloadavg()[0]:.1f} (1-minute average)\n")
    print("| judge | combine | left / right / tie | agreement | Cohen's κ | position-bias rate | picks the "
          "first shown | label mass | seconds |\n|---|---|---|---|---|---|---|---|---|")
    for j in summary["judges"]:
        vs = next(v for v in j["vs"] if v["rater"] == "checker")
        c, pb = j["choices"], j["position_bias"]
        run = j["rater"].removeprefix("model:")
        print(f"| {run} | agree | {c['left']} / {c['right']} / {c['tie']} | {vs['agreement']:.0%} | {vs['kappa']} "
              f"| {pb['rate']:.0%} ({pb['flips']}/{pb['comparisons']}) | {pb['first_share']} | {j['label_mass']} "
              f"| {seconds.get(run, float('nan')):.0f} |")
        mean = mean_choices([r for r in judgements if r["rater"] == j["rater"]])
        m = compare(human, mean)
        counts = [sum(v == k for v in mean.values()) for k in ("left", "right", "tie")]
        print(f"| {run} | mean | {' / '.join(map(str, counts))} | {m['agreement']:.0%} | {m['kappa']} | same | "
              f"same | same | – |")
    c = summary["humans"][0]["choices"]
    print(f"\nchecker: left {c['left']}, right {c['right']}, tie {c['tie']}")
    for j in summary["judges"]:
        vs = next(v for v in j["vs"] if v["rater"] == "checker")
        print(f"{j['rater']} confusion (checker's choice -> judge's): {json.dumps(vs['confusion'])}")

    for j in summary["judges"]:
        name = j["rater"].removeprefix("model:")
        out = llmkit(ws, "judge", "--export", "--in", session, "--out", f"{session}_{name}_prefs",
                     "--set", f"raters={j['rater']}", "--set", "resamples=200")
        print(out.strip().splitlines()[-1])
    llmkit(ws, "judge", "--export", "--in", session, "--out", f"{session}_prefs", "--set", "resamples=200")
    print(llmkit(ws, "report", f"{session}_prefs").strip())


if __name__ == "__main__":
    main()
