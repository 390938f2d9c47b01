"""Benchmark: `llmkit eval --tasks efficiency` over the forms of one model (issue #33's table).

For each model: the llmkit run, and beside it (`efficiency.models`) its exported transformers folder
and its GGUF files, measured in one eval (so one process, one after another). Prints a markdown table
(size, peak memory, prefill / decode tokens/s, request latency p50 / p95 per batch size, each
figure with the machine's 1-minute load average at the start and end of its eval) and whether
llmkit's and transformers' tokens/s agree: the ranges of their three runs overlap.

    python bench/efficiency.py OUT_WS LABEL=RUN[,FORM...] ... [--batch-sizes 1,4] [--repeats 3]

RUN is a checkpoint run (path), FORM an exported folder or a .gguf file; results go to
OUT_WS/eval/eff-LABEL (the run is linked into OUT_WS, never written).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LLMKIT = Path(sys.executable).parent / "llmkit"
MiB = 2**20


def load_average() -> float:
    return os.getloadavg()[0]


def run_eval(ws: Path, label: str, run: Path, forms: list[str], args) -> tuple[dict, tuple[float, float]]:
    link = ws / f"run-{label}"
    if not link.exists():
        link.symlink_to(run.resolve())
    cmd = ["nice", "-n", "5", str(LLMKIT), "eval", "--from", link.name, "-w", str(ws), "--out", f"eff-{label}",
           "--force", "--set", "tasks=efficiency", "--set", f"efficiency.batch_sizes={args.batch_sizes}",
           "--set", f"efficiency.prompt_tokens={args.prompt_tokens}",
           "--set", f"efficiency.new_tokens={args.new_tokens}", "--set", f"efficiency.repeats={args.repeats}"]
    if forms:
        cmd += ["--set", "efficiency.models=" + ",".join(forms)]
    before = load_average()
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    after = load_average()
    results = json.loads((ws / "eval" / f"eff-{label}" / "results.json").read_text())["efficiency"]
    return results, (before, after)


def rows(label: str, results: dict, load: tuple[float, float]):
    forms = {f"{label} · llmkit run": results, **{f"{label} · {Path(p).name} ({r['engine']})": r
                                                 for p, r in results["models"].items()}}
    for name, r in forms.items():
        for run in r["runs"]:
            yield [name, f"{r['size']['file_bytes'] / MiB:.1f}", f"{r['size']['tensor_bytes']:,}",
                   f"{r['peak_memory']['bytes'] / MiB:.0f} ({(r['peak_memory']['bytes'] - r['peak_memory']['before_bytes']) / MiB:+.0f})",
                   str(run["batch_size"]), f"{run['prefill_tokens_per_s']:.0f}", f"{run['decode_tokens_per_s']:.1f}",
                   f"{run['tokens_per_s']:.1f} ({min(run['tokens_per_s_runs']):.1f}–{max(run['tokens_per_s_runs']):.1f})",
                   f"{run['request_latency_p50_s']:.2f} / {run['request_latency_p95_s']:.2f}",
                   f"{load[0]:.1f}→{load[1]:.1f}"]


def agreement(results: dict) -> list[str]:
    """llmkit against transformers: the same tensor bytes; tokens/s ranges of the runs overlap."""
    out = []
    for path, other in results["models"].items():
        if other["engine"] != "transformers":
            continue
        same_size = other["size"]["tensor_bytes"] == results["size"]["tensor_bytes"]
        for ours, theirs in zip(results["runs"], other["runs"]):
            a, b = ours["tokens_per_s_runs"], theirs["tokens_per_s_runs"]
            overlap = max(min(a), min(b)) <= min(max(a), max(b))
            out.append(f"batch {ours['batch_size']}: llmkit {min(a):.1f}–{max(a):.1f}, transformers "
                       f"{min(b):.1f}–{max(b):.1f} tokens/s: {'overlap' if overlap else 'NO overlap'}; "
                       f"tensor bytes equal: {same_size}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ws", type=Path, nargs="?")
    ap.add_argument("models", nargs="*", help="LABEL=RUN[,FORM...]")
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if not args.models:
        return print("skip: needs OUT_WS LABEL=RUN[,FORM...], a checkpoint run and its exports (e.g. make smollm2)")
    args.ws.mkdir(parents=True, exist_ok=True)
    header = ["model · form (engine)", "file MiB", "tensor bytes", "peak RSS MiB (Δ)", "batch", "prefill tok/s",
              "decode tok/s", "tok/s (3 runs)", "request p50 / p95 s", "load 1-min"]
    table, notes = [header, ["---"] * len(header)], []
    for spec in args.models:
        label, _, paths = spec.partition("=")
        run, *forms = paths.split(",")
        results, load = run_eval(args.ws, label, Path(run), forms, args)
        table += list(rows(label, results, load))
        notes += [f"{label}: {n}" for n in agreement(results)]
    print("\n".join("| " + " | ".join(r) + " |" for r in table))
    print("\n".join(notes))


if __name__ == "__main__":
    main()
