"""Optional 1–5 scores of each reply on fixed criteria, given with a judgement.

A judgement may carry `scores`: {"left": {"fluency": 4, …}, "right": {…}}, any criterion of
either side left out (the rater skipped it). The export lists them per reply (`rating_rows`) and
summarises them per model and criterion: the mean with a bootstrap interval (`criterion_means`).
"""

from __future__ import annotations

import numpy as np

CRITERIA = ("fluency", "relevance", "safety")
LOWEST, HIGHEST = 1, 5
SIDES = ("left", "right")


def clean_scores(scores) -> dict:
    """`scores` as the journal stores it (sides without a score left out); ValueError naming
    the expected shape when it is anything else."""
    if scores is None:
        return {}
    shape = (f"scores must look like {{\"left\": {{\"fluency\": 4}}, \"right\": {{…}}}}: sides left/right, "
             f"criteria {', '.join(CRITERIA)}, whole numbers {LOWEST} to {HIGHEST}")
    if not isinstance(scores, dict) or not set(scores) <= set(SIDES):
        raise ValueError(shape)
    for given in scores.values():
        if not isinstance(given, dict) or not set(given) <= set(CRITERIA) or any(
                type(v) is not int or not LOWEST <= v <= HIGHEST for v in given.values()):
            raise ValueError(shape)
    return {side: dict(given) for side, given in scores.items() if given}


def rating_rows(judgements: list[dict], items: dict[str, dict]) -> list[dict]:
    """One row per reply a rater scored: whose reply (model, side), the scores (None where
    not given), the judgement it came with."""
    rows = []
    for j in judgements:
        item = items[j["item"]]
        for side, given in j.get("scores", {}).items():
            rows.append({"judgement": j["id"], "rater": j["rater"], "item": j["item"],
                         "prompt_id": item["prompt_id"], "side": side, "model": item[f"{side}_model"],
                         "reply": item[side], **{c: given.get(c) for c in CRITERIA}})
    return rows


def criterion_means(judgements: list[dict], models: list[str], resamples: int, rng,
                    confidence: float = 0.95) -> list[dict]:
    """Per model and criterion someone scored: the number of scores, their mean and its
    bootstrap interval (scores drawn with replacement)."""
    values: dict[tuple[str, str], list[int]] = {}
    for j in judgements:
        for side, given in j.get("scores", {}).items():
            for criterion, score in given.items():
                values.setdefault((j[f"{side}_model"], criterion), []).append(score)
    tail = (1 - confidence) / 2 * 100
    out = []
    for model in models:
        for criterion in CRITERIA:
            scores = np.array(values.get((model, criterion), []), dtype=float)
            if not len(scores):
                continue
            boot = scores[rng.integers(0, len(scores), (max(resamples, 1), len(scores)))].mean(1)
            low, high = np.percentile(boot, [tail, 100 - tail])
            out.append({"model": model, "criterion": criterion, "n": len(scores),
                        "mean": round(float(scores.mean()), 4),
                        "ci_low": round(float(low), 4), "ci_high": round(float(high), 4)})
    return out


def criteria_markdown(means: list[dict], models: list[str]) -> list[str]:
    """A table of models × criteria: mean [interval] (number of scores); no lines when nobody
    scored."""
    if not means:
        return []
    cell = {(m["model"], m["criterion"]): f"{m['mean']:.2f} [{m['ci_low']:.2f}, {m['ci_high']:.2f}] "
                                         f"({m['n']})" for m in means}
    lines = [f"Scores {LOWEST}–{HIGHEST} per model: mean [interval] (number of scores).", "",
             "| model | " + " | ".join(CRITERIA) + " |", "|---" * (len(CRITERIA) + 1) + "|"]
    lines += [f"| {model} | " + " | ".join(cell.get((model, c), "–") for c in CRITERIA) + " |"
              for model in models if any((model, c) in cell for c in CRITERIA)]
    return ["", *lines]
