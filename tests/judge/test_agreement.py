"""Agreement of a model judge with human raters: Cohen's kappa with ties as a third class,
agreement rate and position bias, on planted judgements."""

from __future__ import annotations

import pytest

from llmkit.judge.agreement import cohen_kappa, judge_summary, judge_summary_markdown, position_bias

HUMAN = ["left", "left", "right", "tie", "tie", "right", "left", "tie", "right", "left"]
MODEL = ["left", "right", "right", "tie", "left", "right", "left", "right", "right", "tie"]


def test_cohen_kappa_by_hand_and_against_sklearn():
    # observed: 6 of 10 alike; human shares L .4 R .3 T .3, model L .3 R .5 T .2
    chance = 0.4 * 0.3 + 0.3 * 0.5 + 0.3 * 0.2
    assert cohen_kappa(HUMAN, MODEL) == pytest.approx((0.6 - chance) / (1 - chance))
    # sklearn.metrics.cohen_kappa_score(HUMAN, MODEL) (scikit-learn 1.9.1; importing it here costs seconds)
    assert cohen_kappa(HUMAN, MODEL) == pytest.approx(0.4029850746268656)
    assert cohen_kappa(["tie"] * 4, ["tie"] * 4) is None  # chance agreement is 1: undefined
    assert cohen_kappa(HUMAN, HUMAN) == pytest.approx(1)


def record(rater, item, choice, orders=None):
    r = {"rater": rater, "item": item, "choice": choice, "left_model": "x", "right_model": "y"}
    if orders:
        r["model_judge"] = {"orders": list(orders), "label_mass": 0.5}
    return r


def test_position_bias_counts_flips_and_first_picks():
    records = [record("m", "1", "left", ("left", "left")),     # consistent
               record("m", "2", "tie", ("left", "right")),     # picked the first shown twice
               record("m", "3", "tie", ("right", "left")),     # picked the second shown twice
               record("m", "4", "tie", ("tie", "left"))]       # one order undecided
    bias = position_bias(records)
    assert bias["flips"] == 3 and bias["rate"] == 0.75
    # side verdicts: (0,left)=first, (1,left)=second, (0,left)=first, (1,right)=first,
    # (0,right)=second, (1,left)=second, (1,left)=second -> 3 of 7 went to the reply shown first
    assert bias["first_share"] == pytest.approx(3 / 7, abs=1e-4)


def test_judge_summary_pairs_each_judge_with_each_human():
    orders = {"left": ("left", "left"), "right": ("right", "right"), "tie": ("left", "right")}
    judgements = [record("checker", str(i), c) for i, c in enumerate(HUMAN)]
    judgements += [record("model:j", str(i), c, orders[c]) for i, c in enumerate(MODEL)]
    judgements.append(record("checker", "skipped", "skip"))
    summary = judge_summary(judgements)
    assert summary["humans"][0]["choices"] == {"left": 4, "right": 3, "tie": 3, "skip": 1}
    (judge,) = summary["judges"]
    assert judge["choices"]["right"] == 5 and judge["position_bias"]["flips"] == 2
    vs = judge["vs"][0]
    assert vs["rater"] == "checker" and vs["items"] == 10 and vs["agreement"] == 0.6
    assert vs["kappa"] == pytest.approx(cohen_kappa(HUMAN, MODEL), abs=1e-4)
    assert vs["confusion"]["tie"]["left"] == 1 and sum(map(sum, (d.values() for d in vs["confusion"].values()))) == 10
    text = judge_summary_markdown(summary, "t")
    assert "| model:j | 10 | 3 / 5 / 2 | 20% (2/10) |" in text and "| checker | 10 | 60% |" in text
