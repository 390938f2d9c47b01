"""lm-evaluation-harness tasks: llmkit's LM (`llmkit eval --tasks`) against lm-eval's own `hf`
backend (`lm_eval --model hf`) on the folder `llmkit export` wrote from the same run, same tasks.

Whole commands, each its own process, timed from start to exit: imports, model loading, task
indexing and dataset loading count on both sides. llmkit finds the shipped tasks without indexing
lm-eval's 14,000 (it does when a name is not llmkit's); `lm_eval` indexes them on every run. Both
sides run offline (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1), fp32, on `--threads` threads.
`lm_eval` reads the shipped tasks from llmkit/eval/harness_tasks (run there: their data_files are
relative to that folder). `--hf-batch-size` is lm-eval's batch size (its CLI default is 1).

Wall and CPU seconds (user + system, the process and its children) are both printed: on a shared
machine the wall time follows the load, the CPU time much less. Each run's accuracies are printed: the two sides must agree (tests/eval/test_harness_parity.py
checks it on tiny models). `--reps` repetitions alternate the order; each figure is the median
[min–max]; the 1-minute load average is printed before each run.

    python bench/harness.py --run /tmp/ws/smollm2 --export /tmp/smol-export \
        [--tasks mmlu_reversal,cmmlu_reversal] [--threads 2] [--reps 3] [--hf-batch-size 1] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "llmkit/eval/harness_tasks"
BIN = Path(sys.executable).parent


def timed(argv: list[str], env: dict, cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the process and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def llmkit_run(run: Path, tasks: str, limit: int | None, env: dict) -> tuple[tuple[float, float], dict]:
    workspace = run.parent
    name = f"bench-harness-{os.getpid()}"
    seconds = timed([str(BIN / "llmkit"), "eval", "--from", run.name, "-w", str(workspace), "--out", name,
                     "--force", "--tasks", tasks, *(["--set", f"harness.limit={limit}"] if limit else [])],
                    env, REPO)
    results = json.loads((workspace / "eval" / name / "results.json").read_text())["harness"]["results"]
    return seconds, results


def hf_run(export: Path, tasks: str, batch_size: int, limit: int | None, out: Path, env: dict
           ) -> tuple[tuple[float, float], dict]:
    seconds = timed([str(BIN / "lm_eval"), "--model", "hf", "--model_args",
                     f"pretrained={export},dtype=float32", "--tasks", tasks, "--include_path", ".",
                     "--device", "cpu", "--batch_size", str(batch_size), "--output_path", str(out),
                     *(["--limit", str(limit)] if limit else [])],
                    env, TASKS)
    found = sorted(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    return seconds, json.loads(found[-1].read_text())["results"]


def accuracies(results: dict) -> str:
    return ", ".join(f"{task} {metrics['acc,none']:.3f}" for task, metrics in sorted(results.items()))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s [{min(values):.1f}–{max(values):.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="an llmkit checkpoint run in a workspace")
    parser.add_argument("--export", type=Path, help="its `llmkit export` folder")
    parser.add_argument("--tasks", default="mmlu_reversal,cmmlu_reversal")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--hf-batch-size", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    args = parser.parse_args()
    if not (args.run and args.export):
        return print("skip: needs --run and --export, a checkpoint run and its `llmkit export` folder (e.g. make smollm2)")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    times: dict[str, list[float]] = {"llmkit": [], "hf": []}
    cpu: dict[str, list[float]] = {"llmkit": [], "hf": []}
    with tempfile.TemporaryDirectory() as scratch:
        for rep in range(args.reps):
            for side in (["llmkit", "hf"] if rep % 2 == 0 else ["hf", "llmkit"]):
                load = os.getloadavg()[0]
                if side == "llmkit":
                    (seconds, used), results = llmkit_run(args.run.resolve(), args.tasks, args.limit, env)
                else:
                    (seconds, used), results = hf_run(args.export.resolve(), args.tasks, args.hf_batch_size,
                                                      args.limit, Path(scratch) / f"hf-{rep}", env)
                times[side].append(seconds)
                cpu[side].append(used)
                print(f"rep {rep + 1} {side:6s} {seconds:6.1f} s wall, {used:6.1f} s CPU  (load {load:.1f})  "
                      f"{accuracies(results)}", flush=True)
    for name, table in (("wall", times), ("CPU", cpu)):
        ratio = [h / m for h, m in zip(table["hf"], table["llmkit"])]
        print(f"\n{name}: llmkit LM {spread(table['llmkit'])}; lm-eval hf (batch {args.hf_batch_size}) "
              f"{spread(table['hf'])}; speed-up {statistics.median(ratio):.2f}x [{min(ratio):.2f}–{max(ratio):.2f}]")


if __name__ == "__main__":
    main()
