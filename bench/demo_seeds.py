"""The demo's post-training over seeds and thread counts: does every run reach its targets?

From a finished demo workspace (`make demo`), for each thread count T of `--threads` and each seed
S of `--seeds`, the demo recipe's post-training chain runs in a workspace of its own:
`pretrain` (threads T, the recipe's seed: one per thread count, as a demo on T threads would start),
then `sft --set seed=S`, and from that SFT model `rm`, `dpo` and `ppo` with the same seed and
threads. The data artifacts (tokenizer, token shards, task sets) are copied from the demo's
workspace: they are byte-identical at any thread count (issue 59), so only training differs.

Every process gets `OMP_NUM_THREADS=T` and `--set threads=T` (pinned: a run's thread count does
not follow the machine's load). Chains run side by side while their threads fit `--cores`.
Prints, and with `--out` writes as Markdown, one row per run with the held-out figures each stage
recorded in its manifest, then the mean and min-max per column, and whether every run reached
the targets (RM pairwise accuracy >= 0.95, DPO exact match >= 0.95, PPO exact match >= 0.90).

    python bench/demo_seeds.py --work /tmp/seeds [--demo workspace] [--seeds 0 1 2] [--threads 1 2]
        [--recipe recipes/demo/recipe.yaml] [--out bench/results/DATE-demo-seeds.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Condition

REPO = Path(__file__).resolve().parents[1]
DATA = ("tokenizer", "tokens", "sft_train", "sft_eval", "pref_train", "pref_eval",
        "prompts_train", "prompts_eval")
TARGETS = {"rm": 0.95, "dpo": 0.95, "ppo": 0.90}


def llmkit(ws: Path, recipe: Path, threads: int, *args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "llmkit", *args, "-w", str(ws), "--recipe", str(recipe),
           "--set", f"threads={threads}"]
    log = ws / "logs" / f"{args[0]}-{args[args.index('--out') + 1]}.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("w") as out:
        if subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode:
            raise SystemExit(f"failed: {' '.join(cmd)} (see {log})")


def stats(ws: Path, name: str) -> dict:
    manifest = json.loads((ws / name / "manifest.json").read_text())
    return {**manifest["stats"], "seconds": manifest["seconds"]}


def prepare(demo: Path, ws: Path, recipe: Path, threads: int) -> None:
    """A workspace with the demo's data artifacts and a pretrain run on `threads` threads."""
    ws.mkdir(parents=True, exist_ok=True)
    for name in DATA:
        if not (ws / name).exists():
            shutil.copytree(demo / name, ws / name, symlinks=True)
    if not (ws / "pretrain" / "manifest.json").exists():
        llmkit(ws, recipe, threads, "pretrain", "--in", "tokens", "--out", "pretrain")


def chain(ws: Path, recipe: Path, threads: int, seed: int) -> dict:
    """sft, then rm, dpo and ppo from it, all with `seed`; the held-out figures of each."""
    sft, seed_set = f"sft_s{seed}", f"seed={seed}"
    runs = [("sft", sft, "--from", "pretrain", "--in", "sft_train", "--eval", "sft_eval"),
            ("rm", f"rm_s{seed}", "--from", sft, "--in", "pref_train", "--eval", "pref_eval"),
            ("dpo", f"dpo_s{seed}", "--from", sft, "--in", "pref_train", "--eval", "pref_eval"),
            ("ppo", f"ppo_s{seed}", "--from", sft, "--in", "prompts_train", "--eval", "prompts_eval")]
    for stage, out, *args in runs:
        if not (ws / out / "manifest.json").exists():
            llmkit(ws, recipe, threads, stage, *args, "--out", out, "--set", seed_set)
    got = {stage: stats(ws, out) for stage, out, *_ in runs}
    return {"threads": threads, "seed": seed,
            "pretrain_val_loss": stats(ws, "pretrain").get("val_loss"),
            "sft": got["sft"]["accuracy"], "rm": got["rm"]["accuracy"],
            "dpo": got["dpo"]["accuracy"], "ppo": got["ppo"]["accuracy"],
            "seconds": round(sum(s["seconds"] for s in got.values()), 1)}


class Cores:
    """Lets a chain start only while the threads of the running ones fit the machine's cores."""

    def __init__(self, cores: int):
        self.free, self.cond = cores, Condition()

    def run(self, threads: int, work):
        with self.cond:
            self.cond.wait_for(lambda: self.free >= threads)
            self.free -= threads
        try:
            return work()
        finally:
            with self.cond:
                self.free += threads
                self.cond.notify_all()


COLUMNS = ("threads", "seed", "pretrain_val_loss", "sft", "rm", "dpo", "ppo", "seconds")


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    for name in ("sft", "rm", "dpo", "ppo"):
        values = [r[name] for r in rows]
        lines.append(f"\n{name}: mean {statistics.mean(values):.3f}, min {min(values):.3f}, "
                     f"max {max(values):.3f}" + (f" (target >= {TARGETS[name]})" if name in TARGETS else ""))
    missed = [f"threads {r['threads']} seed {r['seed']}: {name} {r[name]}" for r in rows
              for name, target in TARGETS.items() if r[name] < target]
    lines.append("\nevery run reached its targets" if not missed else
                 "\nbelow target: " + "; ".join(missed))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo", type=Path, default=REPO / "workspace")
    ap.add_argument("--work", type=Path, help="where the chains' workspaces go")
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "demo" / "recipe.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if os.environ.get("BENCH_QUICK"):
        return print("skip: six post-training chains of the demo take about an hour on 2 cores (no quick size)")
    missing = [name for name in DATA if not (a.demo / name / "manifest.json").is_file()]
    if missing or a.work is None:
        return print(f"skip: needs --work and --demo, a demo workspace (make demo) with {', '.join(DATA)}")
    start = time.time()
    cores = Cores(a.cores)
    spaces = {t: a.work.resolve() / f"threads-{t}" for t in a.threads}
    with ThreadPoolExecutor(len(a.threads)) as pool:
        list(pool.map(lambda t: cores.run(t, lambda: prepare(a.demo, spaces[t], a.recipe.resolve(), t)),
                      a.threads))
    jobs = [(t, s) for t in a.threads for s in a.seeds]
    with ThreadPoolExecutor(len(jobs)) as pool:
        rows = list(pool.map(lambda job: cores.run(job[0], lambda: chain(spaces[job[0]], a.recipe.resolve(),
                                                                          *job)), jobs))
    text = table(rows)
    print(text)
    print(f"\n{len(rows)} chains in {time.time() - start:.0f} s wall")
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
