"""What human judgements say about the models: a Bradley–Terry ranking with bootstrap confidence
intervals, win rates per pair of models, each rater's share of "left" choices and the agreement
of raters who judged the same item; `ranking_report` plots it for `llmkit report`.

A judgement is a comparison of the item's left model with its right one: outcome 1 (left
better), 0 (right better) or 0.5 (a tie, half a win each, as Elo and Chatbot Arena count it).
The fit has one term for the left side itself, P(left wins) = σ(s_left − s_right + h), so a
rater who favours a side shifts h, not the models' scores (sides are drawn at random per item,
so even the raw win rates are unbiased; h makes the ranking so for any side assignment).
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import numpy as np

from llmkit.judge.agreement import is_model_judgement, judge_summary, judge_summary_markdown
from llmkit.judge.ratings import criteria_markdown, criterion_means

RANKING_FILE = "ranking.json"  # in an export artifact; `llmkit report` plots the ones it is given
OUTCOME = {"left": 1.0, "right": 0.0, "tie": 0.5}  # of the left model; skips are no comparison
PRIOR = 0.1  # ridge on scores and h: a model that won (or lost) every comparison stays finite
CONFIDENCE = 0.95


def fit_bradley_terry(n_models: int, left: np.ndarray, right: np.ndarray, outcome: np.ndarray,
                      prior: float = PRIOR) -> tuple[np.ndarray, float]:
    """(log-strength of each model, centred on 0; the left side's advantage h): the penalised
    maximum-likelihood fit, by Newton's method (the objective is strictly concave)."""
    rows = np.arange(len(left))
    x = np.zeros((len(left), n_models + 1))
    x[rows, left] += 1.0
    x[rows, right] -= 1.0
    x[:, n_models] = 1.0
    w = np.zeros(n_models + 1)
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        gradient = x.T @ (outcome - p) - prior * w
        hessian = (x.T * (p * (1 - p))) @ x + prior * np.eye(n_models + 1)
        step = np.linalg.solve(hessian, gradient)
        w += step
        if np.abs(step).max() < 1e-10:
            break
    scores = w[:n_models]
    return scores - scores.mean(), float(w[n_models])


def comparisons(judgements: list[dict], models: list[str]) -> tuple[np.ndarray, ...]:
    """(left model index, right model index, outcome of the left one) of every judgement that
    is not a skip."""
    index = {m: i for i, m in enumerate(models)}
    kept = [j for j in judgements if j["choice"] in OUTCOME]
    return (np.array([index[j["left_model"]] for j in kept], dtype=int),
            np.array([index[j["right_model"]] for j in kept], dtype=int),
            np.array([OUTCOME[j["choice"]] for j in kept], dtype=float))


def interval(samples: np.ndarray) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail], axis=0)
    return low, high


def bt_ranking(models: list[str], left, right, outcome, resamples: int, rng) -> tuple[list[dict], dict]:
    """The models by Bradley–Terry score, best first, each with its interval over `resamples`
    bootstrap fits (judgements drawn with replacement), and h with its interval."""
    scores, h = fit_bradley_terry(len(models), left, right, outcome)
    boot = np.empty((resamples, len(models) + 1))
    for b in range(resamples):
        pick = rng.integers(0, len(outcome), len(outcome))
        s, hb = fit_bradley_terry(len(models), left[pick], right[pick], outcome[pick])
        boot[b] = [*s, hb]
    low, high = interval(boot) if resamples else (np.full(len(models) + 1, np.nan),) * 2
    order = sorted(range(len(models)), key=lambda i: -scores[i])
    ranking = [{"rank": r, "model": models[i], "score": round(float(scores[i]), 4),
                "ci_low": round(float(low[i]), 4), "ci_high": round(float(high[i]), 4),
                **record_of(i, left, right, outcome)} for r, i in enumerate(order, 1)]
    return ranking, {"value": round(h, 4), "ci_low": round(float(low[-1]), 4),
                     "ci_high": round(float(high[-1]), 4)}


def record_of(i: int, left, right, outcome) -> dict:
    mine = np.concatenate([outcome[left == i], 1 - outcome[right == i]])
    return {"wins": int((mine == 1).sum()), "losses": int((mine == 0).sum()),
            "ties": int((mine == 0.5).sum())}


def win_rates(models: list[str], left, right, outcome, resamples: int, rng) -> list[dict]:
    """For each pair of models that met: the first one's share of wins (ties count half) with
    its bootstrap interval."""
    out = []
    for a, b in combinations(range(len(models)), 2):
        wins_of_a = np.concatenate([outcome[(left == a) & (right == b)],
                                    1 - outcome[(left == b) & (right == a)]])
        if not len(wins_of_a):
            continue
        boot = wins_of_a[rng.integers(0, len(wins_of_a), (max(resamples, 1), len(wins_of_a)))].mean(1)
        low, high = interval(boot)
        out.append({"model": models[a], "opponent": models[b], "n": len(wins_of_a),
                    "win_rate": round(float(wins_of_a.mean()), 4),
                    "ci_low": round(float(low), 4), "ci_high": round(float(high), 4)})
    return out


def left_shares(judgements: list[dict]) -> dict[str, float]:
    """Each rater's share of left among their left/right choices: far from 0.5 over many items
    means a rater who favours a side (sides are random)."""
    out = {}
    for rater in sorted({j["rater"] for j in judgements}):
        sides = [j["choice"] for j in judgements if j["rater"] == rater and j["choice"] in ("left", "right")]
        if sides:
            out[rater] = round(sides.count("left") / len(sides), 4)
    return out


def agreement(judgements: list[dict]) -> dict | None:
    """Over items two or more raters judged (skips aside): the share of rater pairs that chose
    alike, and Cohen's kappa against the agreement their pooled choices give by chance."""
    by_item: dict[str, list[str]] = {}
    for j in judgements:
        if j["choice"] in OUTCOME:
            by_item.setdefault(j["item"], []).append(j["choice"])
    shared = {item: choices for item, choices in by_item.items() if len(choices) > 1}
    pairs = [(a, b) for choices in shared.values() for a, b in combinations(choices, 2)]
    if not pairs:
        return None
    observed = sum(a == b for a, b in pairs) / len(pairs)
    pooled = [c for choices in shared.values() for c in choices]
    chance = sum((pooled.count(c) / len(pooled)) ** 2 for c in OUTCOME)
    kappa = None if chance >= 1 else round((observed - chance) / (1 - chance), 4)
    return {"items": len(shared), "pairs": len(pairs), "agreement": round(observed, 4), "kappa": kappa}


def summarize(judgements: list[dict], models: list[str], resamples: int = 1000, seed: int = 0) -> dict:
    """Everything above and the means of the optional scores (llmkit.judge.ratings), as the
    export artifact's ranking.json holds it."""
    rng = np.random.default_rng(seed)
    left, right, outcome = comparisons(judgements, models)
    summary = {"models": models, "judgements": len(judgements), "comparisons": int(len(outcome)),
               "confidence": CONFIDENCE, "resamples": resamples, "ranking": [], "left_advantage": None,
               "win_rates": [], "left_share": left_shares(judgements), "agreement": agreement(judgements)}
    if len(outcome):
        summary["ranking"], summary["left_advantage"] = bt_ranking(models, left, right, outcome, resamples, rng)
        summary["win_rates"] = win_rates(models, left, right, outcome, resamples, rng)
    # last: the intervals above draw the same resamples whether or not anyone gave scores
    summary["criteria"] = criterion_means(judgements, models, resamples, rng, CONFIDENCE)
    if any(is_model_judgement(j) for j in judgements):  # human, model and their agreement
        summary["model_judges"] = judge_summary(judgements)
    return summary


def ranking_markdown(summary: dict, title: str) -> str:
    lines = [f"## {title}", "",
             f"{summary['comparisons']} comparisons ({summary['judgements']} judgements, skips "
             f"included); Bradley–Terry log-strength with {summary['confidence']:.0%} bootstrap "
             f"intervals ({summary['resamples']} resamples).", "",
             "| rank | model | score | interval | wins | losses | ties |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['rank']} | {r['model']} | {r['score']:+.3f} | [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] "
              f"| {r['wins']} | {r['losses']} | {r['ties']} |" for r in summary["ranking"]]
    lines += ["", "| model | opponent | win rate | interval | n |", "|---|---|---|---|---|"]
    lines += [f"| {w['model']} | {w['opponent']} | {w['win_rate']:.3f} | [{w['ci_low']:.3f}, {w['ci_high']:.3f}] "
              f"| {w['n']} |" for w in summary["win_rates"]]
    if summary["agreement"]:
        a = summary["agreement"]
        lines += ["", f"Raters agree on {a['agreement']:.0%} of {a['pairs']} pairs of judgements of "
                      f"{a['items']} shared items (Cohen's kappa {a['kappa']})."]
    lines += criteria_markdown(summary.get("criteria", []), summary["models"])
    lines += ["", "Share of left among each rater's choices: " +
              ", ".join(f"{r} {s:.2f}" for r, s in summary["left_share"].items()), ""]
    if summary.get("model_judges"):
        lines += ["", judge_summary_markdown(summary["model_judges"], "Human and model judges")]
    return "\n".join(lines)


def judged_by(summary: dict) -> str:
    """Whose judgements a summary counts: human, model, or human and model."""
    judges = summary.get("model_judges")
    if not judges:
        return "human"
    return "human and model" if judges["humans"] else "model"


def plot_ranking(summary: dict, path: Path, title: str) -> Path:
    """The models' scores as points with their intervals, best on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["ranking"][::-1]
    fig, ax = plt.subplots(figsize=(6, 1.2 + 0.45 * len(rows)))
    ys = range(len(rows))
    xs = [r["score"] for r in rows]
    errors = [[r["score"] - r["ci_low"] for r in rows], [r["ci_high"] - r["score"] for r in rows]]
    ax.errorbar(xs, ys, xerr=errors, fmt="o", capsize=4)
    ax.set_yticks(list(ys), [r["model"] for r in rows])
    ax.axvline(0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel(f"Bradley–Terry log-strength ({summary['confidence']:.0%} bootstrap interval)")
    ax.set_title(f"{title}: {summary['comparisons']} {judged_by(summary)} comparisons")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ranking_report(artifacts: list[Path], out_dir: Path, fresh: bool) -> list[Path]:
    """For `llmkit report`: a plot per export artifact given, and its tables appended to
    summary.md (`fresh`: to a new one, when no training run wrote it first)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if fresh and artifacts:
        (out_dir / "summary.md").write_text("# Report\n", encoding="utf-8")
    written = []
    for artifact in artifacts:
        summary = json.loads((Path(artifact) / RANKING_FILE).read_text(encoding="utf-8"))
        name = Path(artifact).name
        written.append(plot_ranking(summary, out_dir / f"ranking-{name}.png", name))
        with open(out_dir / "summary.md", "a", encoding="utf-8") as f:
            f.write("\n" + ranking_markdown(summary, f"{judged_by(summary).capitalize()} judgements: {name}") +
                    f"\n![ranking-{name}](ranking-{name}.png)\n")
    return written
