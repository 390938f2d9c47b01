"""How far a run's matrices moved off the Q4_1 grid of the model it started from (issue 52).

An imported Q4_1 GGUF leaves every block of 32 weights (along a row) on m + k d: m the block's minimum
(Q4_1's q = 0) and d one step, the smallest gap between its distinct values. Requantising such
weights rounds few, evenly spaced values, so a quality figure says less about a model trained in full
precision; this says how far training took them: each trained value's distance to the nearest
m + k d of its block, in steps (0 on the grid; spread evenly between levels averages 0.25).

    python bench/grid_distance.py START/model.safetensors TRAINED/model.safetensors > grid.md
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/tokenize.py shadows tokenize


def block_grid(blocks):
    """(m, d) per block of the starting weights; d is inf where a block holds one value."""
    import numpy as np

    s = np.sort(blocks, axis=1)
    gaps = np.diff(s, axis=1)
    gaps[gaps < 1e-9] = np.inf  # equal values are one level, not a step
    return s[:, :1], gaps.min(axis=1, keepdims=True)


def steps_off_grid(blocks, m, d):
    """Each value's distance to its block's nearest level, in steps."""
    import numpy as np

    q = (blocks - m) / d
    return np.abs(q - np.round(q))


def matrix_row(name, start, trained) -> dict:
    import numpy as np

    b0, b1 = start.astype(np.float64).reshape(-1, 32), trained.astype(np.float64).reshape(-1, 32)
    m, d = block_grid(b0)
    ok = np.isfinite(d[:, 0])
    dw = np.abs(b1 - b0)
    return {"name": name, "start_max": steps_off_grid(b0, m, d)[ok].max(),
            "trained_mean": steps_off_grid(b1, m, d)[ok].mean(),
            "on_grid": (steps_off_grid(b1, m, d)[ok].max(axis=1) < 0.01).mean(),
            "dw_max": dw.max(), "dw_median": np.median(dw), "step_median": np.median(d[ok])}


def main() -> None:
    from safetensors.numpy import load_file

    start, trained = load_file(sys.argv[1]), load_file(sys.argv[2])
    rows = [matrix_row(n, start[n], trained[n]) for n in sorted(start)
            if start[n].ndim == 2 and start[n].shape[1] % 32 == 0]
    print("| matrix | start: max distance (steps) | trained: mean distance (steps) | blocks still on grid "
          "| max abs Δw | median abs Δw | median step |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['start_max']:.2e} | {r['trained_mean']:.3f} | {r['on_grid']:.4f} "
              f"| {r['dw_max']:.2e} | {r['dw_median']:.2e} | {r['step_median']:.2e} |")
    on_grid = [r for r in rows if r["start_max"] < 1e-6]
    means = sorted(r["trained_mean"] for r in on_grid)
    print(f"\n{len(on_grid)} of {len(rows)} matrices on the grid at the start; after training their mean distance "
          f"{means[0]:.3f}-{means[-1]:.3f} steps, blocks still on it at most {max(r['on_grid'] for r in on_grid):.4f}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
