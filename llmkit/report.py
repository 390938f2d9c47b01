"""`llmkit report`: PNG plots of the metrics of one or several runs, plus a markdown summary, in
`report/<name>/`: by default the runs' names joined by "+", so that a report of other runs never
replaces this one. `report.json` there names the runs a report was made from and the files it
wrote: a report of the same runs replaces them, one of other runs is refused."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from llmkit.ablate.results import ablation_markdown, is_ablation
from llmkit.errors import ConfigError, UserError
from llmkit.eval.long_context_report import long_context_heatmaps
from llmkit.eval.report import eval_markdown, is_eval_artifact
from llmkit.judge.ranking import RANKING_FILE, ranking_report
from llmkit.train.metrics import METRICS_FILE, read_metrics as read_run_metrics
from llmkit.train.threads import threads_label
from llmkit.core.workspace import MANIFEST, Artifact

# metric -> plot title; a plot is drawn when at least one run logged the metric
PLOTS = {
    "loss": "training loss",
    "val_loss": "validation loss",
    "lr": "learning rate",
    "grad_norm": "gradient norm",
    "tokens_per_s": "tokens / s",
    "mfu": "MFU",
    "reward_mean": "reward (mean)",
    "kl": "KL to reference",
    "rewards/margins": "reward margin (chosen − rejected)",
    "rewards/accuracy": "preference accuracy",
    "accuracy": "accuracy",
}
# what `accuracy` in metrics.jsonl measures, by the stage of the run that logged it
ACCURACY = {"sft": "token accuracy", "rm": "pair accuracy"}
# what a run's manifest records as base_accuracy -> accuracy, measured on held-out rows
HELDOUT = {"sft": "held-out exact match", "dpo": "held-out exact match",
           "ppo": "held-out exact match", "rm": "held-out pair accuracy"}


REPORT_RECORD = "report.json"  # the runs a report was made from and the files it wrote


@dataclass
class ReportConfig:
    name: str = ""           # folder under the workspace's report/ ("": the runs' names joined by "+")
    smooth: int = 1          # moving-average window applied to plotted curves

    def __post_init__(self):
        if self.name in (".", "..") or "/" in self.name or "\\" in self.name:
            raise ConfigError(f"report name must be a folder name (no / or ..), got {self.name!r}")


def read_metrics(run: Path) -> list[dict]:
    check_run(run)
    return read_run_metrics(run)


def check_run(run: Path) -> None:
    if not (run / METRICS_FILE).is_file():
        raise UserError(f"{run} has no {METRICS_FILE}; is it a checkpoint run?")


def read_manifest(run: Path) -> dict:
    """The run's manifest, or {} for a run still training (it is written last)."""
    return Artifact.open(run).manifest if (run / MANIFEST).is_file() else {}


def metric_label(key: str, stage: str | None) -> str:
    return ACCURACY.get(stage, key) if key == "accuracy" else key


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))
           and math.isfinite(r[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def _smooth(ys: list[float], k: int) -> list[float]:
    if k <= 1:
        return ys
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y - (ys[i - k] if i >= k else 0.0)
        out.append(acc / min(i + 1, k))
    return out


def write_report(runs: list[Path], out_dir: Path, cfg: ReportConfig) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = {run: read_metrics(run) for run in runs}
    manifests = {run: read_manifest(run) for run in runs}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key, title in PLOTS.items():
        curves = {run: series(rows, key) for run, rows in metrics.items()}
        if not any(xs for xs, _ in curves.values()):
            continue
        if key == "accuracy":
            title = " / ".join(sorted({metric_label(key, manifests[run].get("stage"))
                                       for run, (xs, _) in curves.items() if xs}))
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for run, (xs, ys) in curves.items():
            if xs:
                ax.plot(xs, _smooth(ys, cfg.smooth), label=run.name)
        ax.set_title(title)
        ax.set_xlabel("step")
        if key in ("loss", "val_loss") and all(y > 0 for _, ys in curves.values() for y in ys):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{key.replace('/', '_')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    (out_dir / "summary.md").write_text(summary_markdown(metrics, written, manifests))
    return written


def summary_markdown(metrics: dict[Path, list[dict]], plots: list[Path],
                     manifests: dict[Path, dict]) -> str:
    """One row per run: the last value of every plotted metric, then the held-out score its
    manifest records (before -> after training)."""
    cells: dict[Path, dict[str, str]] = {run: {} for run in metrics}
    columns: list[str] = []
    for key in PLOTS:
        for run, rows in metrics.items():
            ys = series(rows, key)[1]
            if ys:
                column = f"last {metric_label(key, manifests[run].get('stage'))}"
                cells[run][column] = f"{ys[-1]:.4g}"
                columns.append(column)
    for run in metrics:
        manifest = manifests[run]
        stats, column = manifest.get("stats", {}), HELDOUT.get(manifest.get("stage"))
        if column and stats.get("accuracy") is not None:
            cells[run][column] = f"{_fmt(stats.get('base_accuracy'))} -> {_fmt(stats['accuracy'])}"
            columns.append(column)
        for name, f in (manifest.get("gate") or {}).get("files", {}).items():
            below = " BELOW GATE" if name in manifest["gate"]["failed"] else ""
            cells[run][f"gate {name}"] = f"{_fmt(f['base'])} -> {_fmt(f['run'])}{below}"
            columns.append(f"gate {name}")
        if stats.get("threads"):  # what the run computed on: a figure above means little without it
            cells[run].update({"CPU threads": threads_label(stats["threads"]),
                               "CPU kernels": stats.get("cpu_kernels", "")})
            columns += ["CPU threads", "CPU kernels"]
    columns = list(dict.fromkeys(columns))  # each once, in first-seen order
    lines = ["# Training report", "", "| run | steps | " + " | ".join(columns) + " |",
             "|---" * (len(columns) + 2) + "|"]
    for run, rows in metrics.items():
        steps = max((r.get("step", 0) for r in rows), default=0)
        lines.append(f"| {run.name} | {steps} | " + " | ".join(cells[run].get(c, "") for c in columns) + " |")
    lines += ["", *[f"![{p.stem}]({p.name})" for p in plots], ""]
    return "\n".join(lines)


def _fmt(value) -> str:
    return "?" if value is None else f"{value:.4g}"


def report_name(runs: list[str], longest: int = 100) -> str:
    """The default folder of a report of `runs` (as `run_ids` names them): `pretrain+sft`,
    `eval-sft` for eval/sft, a run outside the workspace by its folder's name; a long list is
    shortened to its first name and a hash of all."""
    names = [Path(r).name if Path(r).is_absolute() else r.replace("/", "-") for r in runs]
    name = "+".join(names)
    if len(name) > longest:
        name = f"{names[0][:40]}+{len(names) - 1}-more-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return name


def run_ids(paths: list[Path], root: Path) -> list[str]:
    """The runs as a report records them: relative to the workspace when inside it."""
    out = []
    for p in paths:
        try:
            out.append(p.resolve().relative_to(Path(root).resolve()).as_posix())
        except ValueError:
            out.append(str(p.resolve()))
    return out


def make_room(out: Path, runs: list[str]) -> None:
    """Clear `out` for a report of `runs`: the files an earlier report of the same runs wrote are
    removed (a plot it no longer draws must not stay); a report of other runs, or a folder llmkit
    did not write, is refused."""
    if not out.exists():
        return
    record = out / REPORT_RECORD
    try:
        made = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else None
    except (OSError, ValueError):
        made = {}
    if made is None and out.is_dir() and all(f.suffix in (".png", ".md") for f in out.iterdir()):
        made = {"runs": runs, "files": [f.name for f in out.iterdir()]}  # written before report.json
    if not isinstance(made, dict) or not isinstance(made.get("files"), list):
        raise UserError(f"{out} exists and is not a report llmkit wrote (no readable {REPORT_RECORD}); "
                        "give this report its own folder with --set name=NAME, or move that one away")
    if made.get("runs") != runs:
        raise UserError(f"{out} holds the report of {', '.join(map(str, made.get('runs') or []))}, and this one "
                        f"is of {', '.join(runs)}: give it its own folder with --set name=NAME, or delete {out} "
                        "to replace it")
    for name in made["files"]:
        if isinstance(name, str) and Path(name).name == name:  # a file of this folder, nothing else
            (out / name).unlink(missing_ok=True)


def run_report(ctx, runs: list[str], cfg: ReportConfig) -> Path:
    if not runs:
        raise UserError("report: name at least one checkpoint run, e.g. `llmkit report pretrain`")
    paths = []
    for r in runs:
        p = Path(r) if Path(r).exists() else ctx.workspace.path(r)
        if not p.is_dir():
            raise UserError(f"report: no run {r!r} (looked for {p})")
        paths.append(p)
    judged = [p for p in paths if (p / RANKING_FILE).is_file()]  # `llmkit judge --export` artifacts
    evals = [p for p in paths if is_eval_artifact(p)]  # `llmkit eval` reports: their own table
    ablations = [p for p in paths if is_ablation(p)]  # `llmkit ablate`: its tables and plots
    runs = [p for p in paths if p not in judged and p not in evals and p not in ablations]
    for run in runs:  # before an earlier report is cleared
        check_run(run)
    ids = run_ids(paths, ctx.workspace.root)
    out = ctx.workspace.path(f"report/{cfg.name or report_name(ids)}")
    make_room(out, ids)
    written = write_report(runs, out, cfg) if runs else []
    written += ranking_report(judged, out, fresh=not runs)
    tables = ([eval_markdown(evals)] if evals else []) + [ablation_markdown(p) for p in ablations]
    heatmaps = long_context_heatmaps(evals, out)  # the `long` task's score by length and depth
    written += heatmaps
    tables += [f"![{p.stem}]({p.name})\n" for p in heatmaps]
    if tables:
        summary = out / "summary.md"
        out.mkdir(parents=True, exist_ok=True)
        before = summary.read_text() + "\n" if (runs or judged) and summary.is_file() else ""
        summary.write_text(before + "\n".join(tables))
    files = [p.name for p in written] + [REPORT_RECORD, "summary.md"]
    (out / REPORT_RECORD).write_text(json.dumps({"runs": ids, "files": files}, indent=1) + "\n", encoding="utf-8")
    print(f"report: {len(written)} plots and summary.md in {out}")
    return out
