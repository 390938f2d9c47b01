"""`llmkit report`: PNG plots of the metrics of one or several runs, plus a markdown summary."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from llmkit.errors import UserError

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


@dataclass
class ReportConfig:
    name: str = "report"     # folder under the workspace's report/ where files are written
    smooth: int = 1          # moving-average window applied to plotted curves


def read_metrics(run: Path) -> list[dict]:
    from llmkit.train.metrics import METRICS_FILE, read_metrics as read_run_metrics

    if not (run / METRICS_FILE).is_file():
        raise UserError(f"{run} has no {METRICS_FILE}; is it a checkpoint run?")
    return read_run_metrics(run)


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
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key, title in PLOTS.items():
        curves = {run: series(rows, key) for run, rows in metrics.items()}
        if not any(xs for xs, _ in curves.values()):
            continue
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
    (out_dir / "summary.md").write_text(summary_markdown(metrics, written))
    return written


def summary_markdown(metrics: dict[Path, list[dict]], plots: list[Path]) -> str:
    keys = [k for k in PLOTS if any(series(rows, k)[0] for rows in metrics.values())]
    lines = ["# Training report", "", "| run | steps | " + " | ".join(f"last {k}" for k in keys)
             + " |", "|---" * (len(keys) + 2) + "|"]
    for run, rows in metrics.items():
        last = [series(rows, k)[1] for k in keys]
        cells = [f"{v[-1]:.4g}" if v else "" for v in last]
        steps = max((r.get("step", 0) for r in rows), default=0)
        lines.append(f"| {run.name} | {steps} | " + " | ".join(cells) + " |")
    lines += ["", *[f"![{p.stem}]({p.name})" for p in plots], ""]
    return "\n".join(lines)


def run_report(ctx, runs: list[str], cfg: ReportConfig) -> Path:
    if not runs:
        raise UserError("report: name at least one checkpoint run, e.g. `llmkit report pretrain`")
    paths = []
    for r in runs:
        p = Path(r) if Path(r).exists() else ctx.workspace.path(r)
        if not p.is_dir():
            raise UserError(f"report: no run {r!r} (looked for {p})")
        paths.append(p)
    out = ctx.workspace.path(f"report/{cfg.name}")
    written = write_report(paths, out, cfg)
    print(f"report: {len(written)} plots and summary.md in {out}")
    return out
