"""An ablation's results: every run's metric values, each variant's mean with its t-interval over
seeds, its paired difference to the baseline with that difference's interval
(llmkit.ablate.intervals); written as results.json, results.md (a table per metric) and one plot
per metric (`<metric>.png`: each variant's mean and interval, its seeds as dots)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from llmkit.ablate.experiment import BASELINE, Experiment, metric_label
from llmkit.ablate.intervals import paired_difference, t_interval
from llmkit.ablate.plan import Plan
from llmkit.core.durable import write_atomic
from llmkit.core.targets import MANIFEST
from llmkit.errors import UserError

RESULTS = "results.json"
TABLE = "results.md"
INTERVAL = "Student t over seeds; the difference to the baseline paired by seed"


def run_manifest(runs: Path, plan: Plan, name: str) -> dict:
    return json.loads((runs / name / MANIFEST).read_text(encoding="utf-8"))


def metric_value(exp: Experiment, runs: Path, plan: Plan, run_name: str, metric: tuple[str, str]) -> float:
    """The run's `metric` from its manifest stats; a UserError naming the key and those there are."""
    stats = run_manifest(runs, plan, run_name).get("stats", {})
    value = stats.get(metric[1])
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        numeric = sorted(k for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        found = "is not there" if metric[1] not in stats else f"is {value!r}, not a number"
        raise UserError(f"{exp.path}: metric {metric_label(exp, metric)!r} {found} in the stats of run {run_name} "
                        f"({runs / run_name / MANIFEST}); its numbers: {', '.join(numeric)}")
    return float(value)


def summarize(exp: Experiment, plan: Plan, runs: Path, confidence: float, commands: dict[str, list[str]]) -> dict:
    """What results.json holds (`commands`: each run's command line after `llmkit`)."""
    cells = []
    for (variant, seed), steps in plan.cells.items():
        cells.append({"variant": variant, "seed": seed, "runs": steps,
                      "values": {metric_label(exp, m): metric_value(exp, runs, plan, steps[m[0]], m)
                                 for m in exp.metrics}})
    metrics = {}
    for m in exp.metrics:
        label = metric_label(exp, m)
        by_variant = {v: {c["seed"]: c["values"][label] for c in cells if c["variant"] == v} for v in exp.names}
        metrics[label] = {
            "variants": {v: {**t_interval(list(vals.values()), confidence).record(), "values": list(vals.values())}
                         for v, vals in by_variant.items()},
            "differences": {v: paired_difference(by_variant[v], by_variant[BASELINE], confidence).record()
                            for v in exp.variants}}
    fingerprints = {r.name: run_manifest(runs, plan, r.name)["fingerprint"] for r in plan.runs}
    return {"experiment": str(exp.path), "confidence": confidence, "interval": INTERVAL, "baseline": BASELINE,
            "seeds": exp.seeds, "metrics": metrics, "cells": cells,
            "runs": {r.name: {"stage": r.stage, "command": ["llmkit", *commands[r.name]],
                              "fingerprint": fingerprints[r.name]} for r in plan.runs}}


def _num(x) -> str:
    return "" if x is None else f"{x:.4g}"


def _interval(entry: dict) -> str:
    return "(one seed)" if entry["low"] is None else f"[{_num(entry['low'])}, {_num(entry['high'])}]"


def markdown(results: dict, title: str) -> str:
    """One table per metric: variant, seeds, mean and its interval, difference to the baseline and
    its interval, each seed's value."""
    pct = f"{results['confidence'] * 100:g}%"
    lines = [f"# Ablation {title}", "", f"Intervals: {pct}, {results['interval']}.", ""]
    for label, metric in results["metrics"].items():
        lines += [f"## {label}", "", f"| variant | seeds | mean | {pct} interval | Δ vs {results['baseline']} | "
                  f"{pct} interval of Δ | values by seed |", "|---|---|---|---|---|---|---|"]
        for variant, entry in metric["variants"].items():
            diff = metric["differences"].get(variant)
            delta = ("", "") if diff is None else (f"{diff['mean']:+.4g}", _interval(diff))
            lines.append(f"| {variant} | {entry['n']} | {_num(entry['mean'])} | {_interval(entry)} | {delta[0]} | "
                         f"{delta[1]} | {', '.join(_num(v) for v in entry['values'])} |")
        lines.append("")
    return "\n".join(lines)


def plot_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label) + ".png"


def write_plots(results: dict, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for label, metric in results["metrics"].items():
        variants = list(metric["variants"])
        fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(variants), 3.6))
        for x, variant in enumerate(variants):
            entry = metric["variants"][variant]
            ax.scatter([x] * len(entry["values"]), entry["values"], color="0.6", s=14, zorder=2)
            err = None if entry["low"] is None else [[entry["mean"] - entry["low"]], [entry["high"] - entry["mean"]]]
            ax.errorbar([x], [entry["mean"]], yerr=err, fmt="o", color="C0" if x else "C1", capsize=5, zorder=3)
        ax.set_xticks(range(len(variants)), variants)
        ax.set_title(f"{label}: mean and {results['confidence'] * 100:g}% t-interval over seeds", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        fig.tight_layout()
        path = folder / plot_name(label)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write_results(results: dict, folder: Path, title: str) -> list[Path]:
    write_atomic(folder / RESULTS, json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    write_atomic(folder / TABLE, markdown(results, title))
    return write_plots(results, folder)


def is_ablation(path: Path) -> bool:
    return (Path(path) / RESULTS).is_file() and (Path(path) / TABLE).is_file()


def ablation_markdown(path: Path) -> str:
    """An ablate artifact's tables and plots, for `llmkit report`."""
    results = json.loads((Path(path) / RESULTS).read_text(encoding="utf-8"))
    plots = [f"![{label}]({Path(path).resolve() / plot_name(label)})" for label in results["metrics"]]
    return markdown(results, Path(path).name).replace("# Ablation", "## Ablation", 1) + "\n" + "\n".join(plots) + "\n"
