"""The eval artifacts' part of `llmkit report`: one table of what each `llmkit eval` measured,
lm-evaluation-harness results (value ± stderr, as lm-eval reports them) beside llmkit's own."""

from __future__ import annotations

import json
from pathlib import Path

from llmkit.eval.stage import RESULTS


def is_eval_artifact(path: Path) -> bool:
    return (path / RESULTS).is_file()


def eval_rows(path: Path) -> list[tuple[str, str, str, float, float | None]]:
    """(eval, task, metric, value, stderr) of one eval artifact: harness metrics with their
    stderr, then llmkit's own headline numbers (manifest stats)."""
    results = json.loads((path / RESULTS).read_text(encoding="utf-8"))
    rows = []
    for task, metrics in results.get("harness", {}).get("results", {}).items():
        for key, value in metrics.items():
            name, _, flt = key.partition(",")
            if not flt or name.endswith("_stderr") or not isinstance(value, (int, float)):
                continue
            stderr = metrics.get(f"{name}_stderr,{flt}")
            rows.append((path.name, task, name, value, stderr if isinstance(stderr, (int, float)) else None))
    manifest = path / "manifest.json"
    stats = json.loads(manifest.read_text(encoding="utf-8")).get("stats", {}) if manifest.is_file() else {}
    for key, value in stats.items():
        if not key.startswith("harness/") and isinstance(value, (int, float)):
            task, _, metric = key.rpartition("/")
            rows.append((path.name, task, metric, value, None))
    return rows


def decontamination_notes(path: Path) -> list[tuple[str, str]]:
    """(task, note) of each lm-eval task of one eval artifact: were the files it is scored on
    among the decontamination inputs of the run's training data (llmkit.eval.provenance)."""
    manifest = path / "manifest.json"
    stats = json.loads(manifest.read_text(encoding="utf-8")).get("stats", {}) if manifest.is_file() else {}
    return [(key.removeprefix("harness/").removesuffix("/decontaminated"), note) for key, note in stats.items()
            if key.startswith("harness/") and key.endswith("/decontaminated")]


def eval_markdown(paths: list[Path]) -> str:
    lines = ["## Evaluations", "", "| eval | task | metric | value | ± stderr |", "|---|---|---|---|---|"]
    for path in paths:
        for name, task, metric, value, stderr in eval_rows(path):
            lines.append(f"| {name} | {task} | {metric} | {value:.4g} | {'' if stderr is None else f'{stderr:.3g}'} |")
    notes = [(path.name, task, note) for path in paths for task, note in decontamination_notes(path)]
    if notes:
        lines += ["", "Decontaminated against each task's scored file(s), upstream of the run's training data:", ""]
        lines += [f"- {name} / {task}: {note}" for name, task, note in notes]
    return "\n".join(lines) + "\n"
