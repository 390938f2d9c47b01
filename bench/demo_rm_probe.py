"""What a demo reward model gets wrong, and what its score head has to read.

For each run given: a reward model (`llmkit rm`) is scored on the demo's held-out pairs
(recipes/demo/data/tasks/pref_eval.jsonl) and its accuracy split by word length and by the kind of
rejected reply (the word unreversed, or two neighbouring letters swapped); a checkpoint run (an SFT
model) gets the spread of the final hidden state a reward model started from it would read — the
last token of each reply — next to the state one token earlier: the mean distance to the mean state
over the mean norm, across the chosen and rejected replies of the pairs. A state that barely moves
with the input leaves the score head little to tell pairs apart with.

    python bench/demo_rm_probe.py WS/rm_s1 WS/sft_s1 ... [--pairs 200]
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# bench/tokenize.py would shadow the standard library's tokenize
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"] + [str(REPO)]

import argparse  # noqa: E402
import json  # noqa: E402
from collections import defaultdict  # noqa: E402

import torch  # noqa: E402

from llmkit.checkpoints.loading import load_model, load_reward_model, load_tokenizer  # noqa: E402
from llmkit.checkpoints.step_folders import checkpoint_step_dir  # noqa: E402
from llmkit.data.preferences import collate_pairs, encode_pair  # noqa: E402
from llmkit.model.reward_model import HEAD_KEY, REWARD_HEAD  # noqa: E402

PAIRS = REPO / "recipes" / "demo" / "data" / "tasks" / "pref_eval.jsonl"


def batches(tokenizer, rows: list[dict]):
    for row in rows:
        batch = collate_pairs([encode_pair(tokenizer, row, 128)], tokenizer.pad_id)
        yield row, torch.tensor(batch["input_ids"]), torch.tensor(batch["attention_mask"])


def rejected_kind(row: dict) -> str:
    word = row["prompt"].split("：" if row["lang"] == "zh" else ": ", 1)[1]
    return "unreversed" if row["rejected"] == word else "neighbours swapped"


@torch.no_grad()
def accuracy_by_kind(run: Path, rows: list[dict]) -> dict[str, tuple[int, int]]:
    model = load_reward_model(run)
    tally = defaultdict(lambda: [0, 0])
    for row, ids, mask in batches(load_tokenizer(checkpoint_step_dir(run)), rows):
        chosen, rejected = model(ids, mask).tolist()
        for key in ("all", f"{len(row['answer'].split())} letters", rejected_kind(row)):
            tally[key][0] += chosen > rejected
            tally[key][1] += 1
    return dict(tally)


@torch.no_grad()
def readout_spread(run: Path, rows: list[dict]) -> dict[str, float]:
    model, step_dir = load_model(run)
    states = {"last token": [], "one before": []}
    for _, ids, mask in batches(load_tokenizer(step_dir), rows):
        hidden, last = model.eval().hidden_states(ids), mask.sum(1) - 1
        for i in range(len(ids)):
            states["last token"].append(hidden[i, last[i]])
            states["one before"].append(hidden[i, last[i] - 1])
    spread = {}
    for name, vectors in states.items():
        v = torch.stack(vectors)
        spread[name] = float((v - v.mean(0)).norm(dim=1).mean() / v.norm(dim=1).mean())
    return spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="reward model or SFT runs")
    parser.add_argument("--pairs", type=int, default=200, help="held-out pairs read")
    a = parser.parse_args()
    if not a.runs:  # `make bench` calls every script bare
        return print("skip: give the runs of a demo workspace (make demo: WS/rm, WS/sft)")
    torch.set_num_threads(1)
    rows = [json.loads(line) for line in PAIRS.read_text(encoding="utf-8").splitlines()][:a.pairs]
    for run in a.runs:
        config = json.loads((checkpoint_step_dir(run) / "config.json").read_text())
        if config.get(HEAD_KEY) == REWARD_HEAD:
            cells = ", ".join(f"{k} {right}/{n} ({right / n:.3f})"
                              for k, (right, n) in sorted(accuracy_by_kind(run, rows).items()))
            print(f"{run}: reward model, pairs right: {cells}")
        else:
            cells = ", ".join(f"{k} {v:.3f}" for k, v in readout_spread(run, rows).items())
            print(f"{run}: read-out state spread over {2 * len(rows)} replies: {cells}")


if __name__ == "__main__":
    main()
