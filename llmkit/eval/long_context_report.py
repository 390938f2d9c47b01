"""The long-context part of `llmkit report`: one heat map per eval artifact that ran the `long` task
(llmkit.eval.long_context), a panel per (test, language), length down, depth across, the mean score
in each cell; lengths beyond the model's window are marked."""

from __future__ import annotations

import json
from pathlib import Path

from llmkit.eval.stage import RESULTS


def long_context_results(path: Path) -> dict | None:
    results = json.loads((path / RESULTS).read_text(encoding="utf-8"))
    long = results.get("long")
    return long if isinstance(long, dict) and long.get("cells") else None


def long_context_heatmaps(evals: list[Path], out_dir: Path) -> list[Path]:
    """`long-context-<eval>.png` in out_dir for each eval artifact with long-context results."""
    written = []
    for path in evals:
        results = long_context_results(path)
        if results is not None:
            written.append(heatmap(results, out_dir / f"long-context-{path.name}.png", path.name))
    return written


def heatmap(results: dict, target: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells = results["cells"]
    lengths, depths = sorted({c["length"] for c in cells}), sorted({c["depth"] for c in cells})
    panels = list(dict.fromkeys((c["test"], c["lang"]) for c in cells))
    cols = min(len(panels), 4)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.2 + 2.6 * cols, 0.6 + (1.2 + 0.3 * len(lengths)) * rows),
                             squeeze=False, layout="constrained")
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    image = None
    for ax, (test, lang) in zip(axes.flat, panels):
        grid = np.full((len(lengths), len(depths)), np.nan)
        for c in cells:
            if (c["test"], c["lang"]) == (test, lang):
                grid[lengths.index(c["length"]), depths.index(c["depth"])] = c["score"]
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
        ax.set_title(f"{test} ({lang})", fontsize=9)
        ax.set_xticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        ax.set_yticks(range(len(lengths)), [f"{n}{'*' if n > results['window'] else ''}" for n in lengths],
                      fontsize=7)
        ax.set_xlabel("needle depth", fontsize=8)
        ax.set_ylabel("tokens", fontsize=8)
    fig.suptitle(f"{title}: score by length and depth (* beyond the model's {results['window']}-token window)",
                 fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.8)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target
