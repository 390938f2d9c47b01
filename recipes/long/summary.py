"""Before and after the context extension: `python recipes/long/summary.py WS [SUFFIX]`.

Prints the `long` task's mean score per test and language at each length (1x, 2x and 4x the base
model's window, over the depths) for `retrieve` (past its window with its RoPE as it is), `yarn`
and, where `make control` ran it, `plain` (yarn's training without the scaling); and each run's
held-out loss per token at the base's window: tokens_short's val split scored in 256-token windows,
all of it and the demo corpus's documents alone. Writes WS/long_summary.json. SUFFIX names
another seed's runs (e.g. `_s1`: retrieve_s1, yarn_s1, plain_s1)."""

import json
import sys
from collections import defaultdict
from pathlib import Path

RUNS = ("retrieve", "yarn", "plain")
SCORED = "tokens_short:val"
TASK_SOURCE = "retrieval_short"


def results(ws: Path, run: str) -> dict:
    path = ws / "eval" / run / "results.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def scores_by_length(long: dict) -> dict[str, dict[int, float]]:
    """{"needle/en": {256: mean score over the depths, ...}, ...}"""
    cells = defaultdict(lambda: defaultdict(list))
    for c in long.get("cells", []):
        cells[f"{c['test']}/{c['lang']}"][c["length"]].append(c["score"])
    return {k: {n: sum(v) / len(v) for n, v in sorted(by.items())} for k, by in sorted(cells.items())}


def held_out_loss(ppl: dict) -> dict[str, float]:
    """Loss per token of the scored split: all of it, and its text sources without the retrieval documents."""
    by_source = ppl[SCORED]["by_source"]
    text = [v for s, v in by_source.items() if s != TASK_SOURCE]
    corpus = sum(v["nll_per_token"] * v["tokens"] for v in text) / sum(v["tokens"] for v in text)
    return {"all": ppl[SCORED]["nll_per_token"], "corpus": corpus}


def main() -> None:
    ws, suffix = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "")
    out = {run: {"long": scores_by_length(r["long"]), "loss": held_out_loss(r["ppl"])}
           for run in RUNS if (r := results(ws, run + suffix))}
    lengths = sorted({n for run in out.values() for by in run["long"].values() for n in by})
    print(f"{'long task score':16}" + "".join(f"{r}@{n}".rjust(15) for r in out for n in lengths))
    for key in sorted({k for run in out.values() for k in run["long"]}):
        row = [out[r]["long"].get(key, {}).get(n) for r in out for n in lengths]
        print(f"{key:16}" + "".join("n/a".rjust(15) if x is None else f"{x:15.3f}" for x in row))
    before = out["retrieve"]["loss"]
    for run in out:
        print(f"held-out loss at 256 tokens, {run}: " + ", ".join(
            f"{part} {loss:.4f} ({100 * (loss / before[part] - 1):+.2f}%)" for part, loss in out[run]["loss"].items()))
    (ws / f"long_summary{suffix}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
