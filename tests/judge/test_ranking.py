"""Bradley–Terry from judgements: known strengths come back in order, ties count half, and raters
who judged the same items are compared."""

import numpy as np

from llmkit.judge.ranking import agreement, fit_bradley_terry, summarize


def simulated(strengths: list[float], n: int, seed: int = 0) -> list[dict]:
    """Judgements of random pairs on random sides, each won with the Bradley–Terry probability."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        a, b = rng.choice(len(strengths), 2, replace=False)
        left_wins = rng.random() < 1 / (1 + np.exp(strengths[b] - strengths[a]))
        out.append({"id": str(k), "item": str(k), "rater": "r", "left_model": f"m{a}", "right_model": f"m{b}",
                    "choice": "left" if left_wins else "right"})
    return out


def test_known_strengths_come_back_in_order_with_intervals_around_them():
    truth = [1.0, 0.0, -1.0]
    summary = summarize(simulated(truth, 600), ["m0", "m1", "m2"], resamples=200)
    assert [r["model"] for r in summary["ranking"]] == ["m0", "m1", "m2"]
    for row in summary["ranking"]:
        assert row["ci_low"] <= truth[int(row["model"][1])] <= row["ci_high"]
    assert summary["ranking"][0]["ci_low"] > summary["ranking"][2]["ci_high"]


def test_a_tie_counts_half_a_win_each():
    left, right = np.array([0, 0]), np.array([1, 1])
    scores, h = fit_bradley_terry(2, left, right, np.array([0.5, 0.5]))
    assert np.allclose(scores, 0) and abs(h) < 1e-9
    scores, _ = fit_bradley_terry(2, np.array([0, 1]), np.array([1, 0]), np.array([1.0, 0.5]))
    assert scores[0] > scores[1]


def test_agreement_counts_pairs_of_raters_on_shared_items():
    judgements = [{"item": "a", "rater": "x", "choice": "left"}, {"item": "a", "rater": "y", "choice": "left"},
                  {"item": "b", "rater": "x", "choice": "left"}, {"item": "b", "rater": "y", "choice": "right"},
                  {"item": "c", "rater": "x", "choice": "tie"}, {"item": "b", "rater": "z", "choice": "skip"}]
    assert agreement(judgements) == {"items": 2, "pairs": 2, "agreement": 0.5, "kappa": round((0.5 - 0.625) / 0.375, 4)}
    assert agreement(judgements[:1]) is None
