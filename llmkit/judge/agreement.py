"""How a model judge's verdicts compare with human raters': agreement rate and Cohen's kappa over
the items both judged, and the judge's position bias.

A judgement is a model's when its journal record carries `model_judge` (written by
`llmkit judge --model`, llmkit.judge.model_judge); every other rater is a human. Choices are
three classes, left, right and tie (skips are no comparison). Cohen's kappa is
(p_o − p_e) / (1 − p_e), p_o the share of shared items both chose alike, p_e the agreement
chance gives when each rater keeps their own shares of left, right and tie (not pooled, as
`llmkit.judge.ranking.agreement` pools several human raters); it is undefined (None) when both
raters always chose the same one class. The position-bias rate is the share of a judge's
comparisons whose verdict flips when the replies swap places; `first_share` is the share of
its per-order verdicts, ties aside, that picked whichever reply was shown first.
"""

from __future__ import annotations

CLASSES = ("left", "right", "tie")


def cohen_kappa(a: list[str], b: list[str], classes=CLASSES) -> float | None:
    """Cohen's kappa of two raters' labels of the same items (None when chance agreement is 1)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"cohen_kappa needs two equally long, non-empty label lists, got {len(a)} and {len(b)}")
    n = len(a)
    observed = sum(x == y for x, y in zip(a, b)) / n
    chance = sum((a.count(c) / n) * (b.count(c) / n) for c in classes)
    return None if chance >= 1 else (observed - chance) / (1 - chance)


def is_model_judgement(judgement: dict) -> bool:
    return "model_judge" in judgement


def rater_choices(judgements: list[dict], rater: str) -> dict[str, str]:
    """item -> the rater's choice, skips left out."""
    return {j["item"]: j["choice"] for j in judgements if j["rater"] == rater and j["choice"] in CLASSES}


def compare(first: dict[str, str], second: dict[str, str]) -> dict | None:
    """Agreement and kappa of two raters over the items both judged; the confusion counts
    (first's choice -> second's choice -> n). None when they share no item."""
    shared = [item for item in first if item in second]
    if not shared:
        return None
    a, b = [first[i] for i in shared], [second[i] for i in shared]
    kappa = cohen_kappa(a, b)
    confusion = {x: {y: sum(p == x and q == y for p, q in zip(a, b)) for y in CLASSES} for x in CLASSES}
    return {"items": len(shared), "agreement": round(sum(p == q for p, q in zip(a, b)) / len(shared), 4),
            "kappa": None if kappa is None else round(kappa, 4), "confusion": confusion}


def position_bias(records: list[dict]) -> dict:
    """Over a judge's records: comparisons, flips (the two orders' verdicts differ), their rate,
    and the share of per-order side verdicts that went to the reply shown first."""
    flips = sum(r["model_judge"]["orders"][0] != r["model_judge"]["orders"][1] for r in records)
    # order 0 shows the left reply first, order 1 the right one
    sides = [(k, o) for r in records for k, o in enumerate(r["model_judge"]["orders"]) if o != "tie"]
    first = sum((k == 0) == (o == "left") for k, o in sides)
    return {"comparisons": len(records), "flips": flips,
            "rate": round(flips / len(records), 4) if records else None,
            "first_share": round(first / len(sides), 4) if sides else None}


def choice_counts(judgements: list[dict]) -> dict[str, int]:
    return {c: sum(j["choice"] == c for j in judgements) for c in (*CLASSES, "skip")}


def judge_summary(judgements: list[dict]) -> dict:
    """Per human rater their choices; per model judge its choices, position bias, the mean share
    of its next-token probability on the labels, and its agreement with each human rater."""
    humans = sorted({j["rater"] for j in judgements if not is_model_judgement(j)})
    judges = sorted({j["rater"] for j in judgements if is_model_judgement(j)})
    human_choices = {h: rater_choices(judgements, h) for h in humans}
    out = {"humans": [{"rater": h, "judgements": sum(j["rater"] == h for j in judgements),
                       "choices": choice_counts([j for j in judgements if j["rater"] == h])} for h in humans],
           "judges": []}
    for rater in judges:
        records = [j for j in judgements if j["rater"] == rater and is_model_judgement(j)]
        mine = rater_choices(judgements, rater)
        masses = [r["model_judge"].get("label_mass") for r in records if r["model_judge"].get("label_mass") is not None]
        out["judges"].append({
            "rater": rater, "judgements": len(records), "choices": choice_counts(records),
            "position_bias": position_bias(records),
            "label_mass": round(sum(masses) / len(masses), 4) if masses else None,
            "vs": [{"rater": h, **found} for h in humans if (found := compare(human_choices[h], mine))]})
    return out


def _num(x, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def judge_summary_markdown(summary: dict, title: str) -> str:
    """The summary as a markdown section: human raters, then one row per judge and human."""
    lines = [f"## {title}", ""]
    for h in summary["humans"]:
        c = h["choices"]
        lines.append(f"Human rater {h['rater']}: {h['judgements']} judgements (left {c['left']}, right "
                     f"{c['right']}, tie {c['tie']}, skip {c['skip']}).")
    if not summary["judges"]:
        return "\n".join(lines + ["No model judge has judged these items.", ""])
    lines += ["", "| model judge | judgements | left / right / tie | position-bias rate | picks the first shown "
              "| label mass | vs human | items | agreement | Cohen's κ |", "|---|---|---|---|---|---|---|---|---|---|"]
    for j in summary["judges"]:
        c, pb = j["choices"], j["position_bias"]
        head = (f"| {j['rater']} | {j['judgements']} | {c['left']} / {c['right']} / {c['tie']} "
                f"| {_num(pb['rate'], '.0%')} ({pb['flips']}/{pb['comparisons']}) | {_num(pb['first_share'], '.0%')} "
                f"| {_num(j['label_mass'])}")
        vs = j["vs"] or [None]
        for v in vs:
            tail = "| – | – | – | – |" if v is None else \
                f"| {v['rater']} | {v['items']} | {v['agreement']:.0%} | {_num(v['kappa'])} |"
            lines.append(f"{head} {tail}")
    lines += ["", "Position-bias rate: the share of comparisons whose verdict flips when the replies swap "
              "places; label mass: the share of the judge's next-token probability on the answer labels.", ""]
    return "\n".join(lines)
