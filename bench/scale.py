"""Benchmark: do the data stages keep their rate and memory as the corpus grows?

For each size N (default 50k, 200k, 800k documents of ~2.4 KB of English-like text: about
0.1, 0.4 and 1.6 GB), a planted-duplicate corpus (`llmkit.data.dedup.planted`: originals,
exact copies, edited copies, look-alikes, unique documents, shuffled) is written as jsonl
files and cached under --work. Then these whole commands run, each a fresh
`python -m llmkit … --workers 1` process, timed by `os.wait4` on it (its CPU seconds and peak
RSS, ru_maxrss):

* `llmkit ingest` (one task per jsonl file: the same part size at every N): MB of text / CPU-s;
* `llmkit dedup --method minhash --in raw`: docs / CPU-s, peak RSS and its ratio to the
  corpus, pair precision / recall against the planted truth;
* `llmkit clean --in raw`: MB / CPU-s;
* `llmkit tokenize --in raw` with a tokenizer (vocab 8,000) trained once on the smallest corpus.

Each command's rate at each N is divided by its rate at the smallest N: "flat" when every ratio
is within ±20 %. RSS is printed in MB and in MB per GB of corpus. With --ray (the default) the
same dedup runs again on a local Ray cluster of 2 CPUs (`--executor ray --set ray.num_cpus=2`):
is the artifact identical (kept and removed rows), and what does Ray cost in wall and CPU
seconds? Ray's workers are not the driver's waited-for children, so those two runs are also
measured by the CPU of the whole process tree (psutil, sampled every 0.1 s) and of the whole
machine (/proc/stat: other work on the machine counts too; the load average is printed before
and after every command so that the figures can be judged).

The first run of each command on a machine compiles kernels (numba's cache): the smallest size
gets one untimed run of every command first. A command's start-up (imports: ~0.4 CPU-s, ~100
MB) weighs on the rates of corpora of a few MB: sizes under ~50k only check the script.

    OMP_NUM_THREADS=1 python bench/scale.py [--sizes 50000,200000,800000] [--reps 1]
                                            [--no-ray] [--work /tmp/llmkit-scale] [--json F]
"""

from __future__ import annotations

import sys

# the repository root, not bench/, goes on the path: bench/tokenize.py would shadow the
# standard library's tokenize (which pandas, imported by pyarrow, needs)
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LLMKIT = [sys.executable, "-m", "llmkit"]
WORDS = (260, 440)   # words per document: ~2.4 KB of made-up English words
CORPUS_VERSION = 1   # bump when the generated corpus changes, so caches are not reused
# This process never imports numpy or pyarrow: a child's ru_maxrss starts at the RSS of its
# parent (fork + exec carry it), so whatever needs them runs in a fresh process of its own.


def in_fresh_process(fn, *args):
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


# -- the corpus ---------------------------------------------------------------------------

def generate_corpus(n: int, seed: int, parts: int, out: Path) -> dict:
    """N planted documents as `parts` jsonl files, the truth clusters as truth.json. In one
    planted_corpus call: one vocabulary for the whole corpus (a call per chunk would draw a new
    one per chunk, and the text's statistics, the tokenizer's above all, would change with N).
    ~3 GB of memory at 800k documents, in this throw-away process."""
    from llmkit.data.dedup.planted import planted_corpus

    # per original: 1 + 0.3 exact + 1.0 edited + 0.3 look-alike ≈ 2.6 documents (Poisson
    # counts); a few more than N are drawn and the shuffled corpus is cut at N
    originals = max(1, n // 4)
    corpus = planted_corpus(originals, words=WORDS, unique=max(0, n - int(originals * 2.6))
                            + n // 50 + 50, seed=seed)
    if len(corpus) < n:
        raise SystemExit(f"planted_corpus drew {len(corpus)} < {n} documents")
    (out / "jsonl").mkdir(parents=True, exist_ok=True)
    text_bytes, bounds = 0, [n * k // parts for k in range(parts + 1)]
    for k in range(parts):
        with open(out / "jsonl" / f"part-{k:05d}.jsonl", "w", encoding="utf-8") as f:
            for i in range(bounds[k], bounds[k + 1]):
                f.write(json.dumps({"id": f"d{i:07d}", "text": corpus.texts[i]}) + "\n")
                text_bytes += len(corpus.texts[i].encode())
    (out / "truth.json").write_text(json.dumps(corpus.truth[:n]))
    return {"docs": n, "seed": seed, "parts": parts, "words": list(WORDS),
            "version": CORPUS_VERSION, "text_bytes": text_bytes}


def cached_corpus(work: Path, n: int, seed: int, part_docs: int) -> dict:
    # at least 4 parts: the Ray run's 2 workers have tasks to share at every size
    parts = max(4, round(n / part_docs))
    meta_file = work / "meta.json"
    want = {"docs": n, "seed": seed, "parts": parts, "words": list(WORDS),
            "version": CORPUS_VERSION}
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
        if {k: meta.get(k) for k in want} == want:
            return meta
    t = time.perf_counter()
    meta = in_fresh_process(generate_corpus, n, seed, parts, work)
    meta_file.write_text(json.dumps(meta))
    print(f"  generated {n:,} documents ({meta['text_bytes'] / 1e6:,.0f} MB of text, "
          f"{parts} files) in {time.perf_counter() - t:.0f} s")
    return meta


# -- running one command ------------------------------------------------------------------

@dataclass
class Run:
    wall_s: float
    cpu_s: float           # the command's process and the children it waited for (wait4)
    peak_rss_mb: float     # ru_maxrss of the same
    tree_cpu_s: float      # every process under the command (psutil samples), >= cpu_s
    machine_cpu_s: float   # the whole machine's CPU time over the run (/proc/stat)
    load: tuple = ()       # 1-minute load average before and after
    descendants: list = field(default_factory=list)  # names of the processes seen under it


def machine_cpu_seconds() -> float:
    # user nice system idle iowait irq softirq steal: everything but idle and iowait is busy
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class TreeSampler(threading.Thread):
    """CPU seconds of every process under `pid` (the command itself included), from their
    latest sample: Ray's workers are started by its raylet, and no one wait4s for them."""

    def __init__(self, pid: int, every: float = 0.1):
        super().__init__(daemon=True)
        self.pid, self.every, self.seen, self.stop = pid, every, {}, threading.Event()

    def run(self) -> None:
        try:
            import psutil
        except ImportError:
            return
        while not self.stop.wait(self.every):
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for p in procs:
                try:
                    with p.oneshot():
                        t = p.cpu_times()  # its own time only: children_* would count twice
                        self.seen[p.pid, p.create_time()] = (p.name(), t.user + t.system)
                except psutil.Error:
                    pass

    def result(self) -> tuple[float, list]:
        self.stop.set()
        self.join()
        names = sorted({name for (pid, _), (name, _) in self.seen.items() if pid != self.pid})
        return sum(cpu for _, cpu in self.seen.values()), names


def run_llmkit(args: list, log: Path) -> Run:
    args = [str(a) for a in args]
    load0, machine0, t0 = os.getloadavg()[0], machine_cpu_seconds(), time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(LLMKIT + args, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=ROOT)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait again
    wall, machine = time.perf_counter() - t0, machine_cpu_seconds() - machine0
    tree_cpu, names = sampler.result()
    if proc.returncode != 0:
        raise SystemExit(f"llmkit {' '.join(args)} failed (exit {proc.returncode}); its log, "
                         f"{log}, ends:\n{log.read_text()[-3000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    run = Run(wall, cpu, usage.ru_maxrss / 1024, max(cpu, tree_cpu), machine,
              (load0, os.getloadavg()[0]), names)
    print(f"    {args[0]:<9} {wall:7.1f} s wall {cpu:7.1f} CPU-s {run.peak_rss_mb:6.0f} MB "
          f"load {load0:.1f} -> {run.load[1]:.1f}"
          + (f"  (tree {run.tree_cpu_s:.1f} CPU-s, machine {machine:.1f} CPU-s, "
             f"under it: {', '.join(names)})" if names else ""), flush=True)
    return run


# -- checking the output ------------------------------------------------------------------

def planted_scores(artifact: Path, truth_file: Path) -> tuple[float, float]:
    """Pair precision and recall of a dedup artifact: a removed row joins the cluster of the
    document it names in `duplicate_of` (as bench/dedup.py counts)."""
    import numpy as np

    from llmkit.data.dedup.planted import pair_scores
    from llmkit.data.io import read_table

    truth = json.loads(truth_file.read_text())
    labels = np.arange(len(truth))
    removed = read_table(artifact / "removed", columns=["id", "duplicate_of"])
    for doc, kept in zip(removed.column("id").to_pylist(),
                         removed.column("duplicate_of").to_pylist()):
        labels[int(doc[1:])] = int(kept[1:])
    return pair_scores(truth, labels)


def same_artifact(a: Path, b: Path) -> bool:
    """Kept rows and removed rows equal, parts read in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from llmkit.data.io import dataset_files

    def rows(path: Path):
        return pa.concat_tables([pq.read_table(f) for f in dataset_files(path)])

    return all(rows(a / sub).equals(rows(b / sub)) for sub in ("", "removed"))


# -- figures --------------------------------------------------------------------------------

def summary(runs: list[Run], amount: float) -> dict:
    """Median rate (amount per CPU second) of the repetitions and their spread."""
    rates = [amount / r.cpu_s for r in runs]
    return {"rate": statistics.median(rates), "min": min(rates), "max": max(rates),
            "rss_mb": statistics.median(r.peak_rss_mb for r in runs),
            "wall_s": statistics.median(r.wall_s for r in runs),
            "tree_cpu_s": statistics.median(r.tree_cpu_s for r in runs),
            "machine_cpu_s": statistics.median(r.machine_cpu_s for r in runs),
            "runs": [asdict(r) for r in runs]}


COMMANDS = {  # name: (unit of the rate, what the rate counts)
    "ingest": ("MB/CPU-s", "mb"), "dedup": ("docs/CPU-s", "docs"),
    "clean": ("MB/CPU-s", "mb"), "tokenize": ("MB/CPU-s", "mb"),
}


def measure_size(n: int, args, tokenizer: Path | None, warm_up: bool) -> tuple[dict, Path]:
    work = args.work / f"n{n}"
    work.mkdir(parents=True, exist_ok=True)
    print(f"\n{n:,} documents ({work})", flush=True)
    meta = cached_corpus(work, n, args.seed, args.part_docs)
    ws, logs = work / "ws", work / "logs"
    logs.mkdir(exist_ok=True)
    files = sorted((work / "jsonl").glob("part-*.jsonl"))
    base = ["-w", ws, "--workers", 1, "--force"]
    steps = {"ingest": ["ingest", *files, *base, "--set", "task_bytes=1"],  # a task per file
             "dedup": ["dedup", "--method", "minhash", "--in", "raw", "--out", "dedup", *base],
             "clean": ["clean", "--in", "raw", "--out", "clean", *base],
             "tokenize": ["tokenize", "--in", "raw", "--out", "tokens", "--tokenizer",
                          None, *base]}
    amount = {"docs": n, "mb": meta["text_bytes"] / 1e6}
    figures = {"docs": n, "mb": amount["mb"], "parts": meta["parts"]}
    runs = {name: [] for name in steps}
    for rep in range(args.reps + warm_up):
        for name, cmd in steps.items():
            if name == "tokenize" and tokenizer is None:  # trained once, on the smallest corpus
                print("    (training the tokenizer, vocab 8,000)", flush=True)
                run_llmkit(["tokenizer", "-w", ws, "--in", "raw", "--set", "vocab_size=8000"],
                           logs / "tokenizer.log")
                tokenizer = ws / "tokenizer"
            cmd = [tokenizer if c is None else c for c in cmd]
            if rep == 0 and warm_up:
                print(f"    (untimed warm-up run of {name})", flush=True)
            run = run_llmkit(cmd, logs / f"{name}-{rep}.log")
            if not (rep == 0 and warm_up):
                runs[name].append(run)
    for name, (_, what) in COMMANDS.items():
        figures[name] = summary(runs[name], amount[what])
    figures["precision"], figures["recall"] = in_fresh_process(
        planted_scores, ws / "dedup", work / "truth.json")
    if args.ray:
        ray_runs = [run_llmkit(["dedup", "--method", "minhash", "--in", "raw", "--out",
                                "dedup_ray", *base, "--executor", "ray", "--set",
                                "ray.num_cpus=2"], logs / f"dedup_ray-{rep}.log")
                    for rep in range(args.reps)]
        figures["dedup_ray"] = summary(ray_runs, n)
        figures["ray_identical"] = in_fresh_process(same_artifact, ws / "dedup", ws / "dedup_ray")
        figures["ray_processes"] = sorted({p for r in ray_runs for p in r.descendants})
    return figures, tokenizer


def flatness(results: dict, name: str, key: str = "rate") -> tuple[list[float], bool]:
    rates = [results[n][name][key] for n in results]
    ratios = [r / rates[0] for r in rates]
    return ratios, all(0.8 <= x <= 1.2 for x in ratios)


def print_report(results: dict, ray: bool) -> None:
    sizes = list(results)
    print(f"\n{'docs':>9} {'corpus':>9}" + "".join(f" {c + ' ' + COMMANDS[c][0]:>26}"
                                               for c in COMMANDS) + f" {'dedup P / R':>17}")
    for n, r in results.items():
        print(f"{n:>9,} {r['mb']:>6,.0f} MB" + "".join(
            f" {r[c]['rate']:>26,.1f}" if len(r[c]["runs"]) == 1 else
            f" {r[c]['rate']:>12,.1f} ({r[c]['min']:,.1f}–{r[c]['max']:,.1f})" for c in COMMANDS)
            + f" {r['precision']:>8.4f} / {r['recall']:.4f}")
    print("\nrate at each size / rate at the smallest (CPU seconds; flat: every ratio 0.8–1.2)")
    for c in COMMANDS:
        ratios, flat = flatness(results, c)
        print(f"  {c:<9} " + "  ".join(f"{x:.2f}" for x in ratios)
              + f"   flat ±20%: {'yes' if flat else 'no'}")
    print("\npeak RSS, MB (MB per GB of corpus)")
    for c in COMMANDS:
        print(f"  {c:<9} " + "  ".join(
            f"{results[n][c]['rss_mb']:7.0f} ({results[n][c]['rss_mb'] / (results[n]['mb'] / 1e3):,.0f})"
            for n in sizes))
    print("  dedup RSS / corpus: " + "  ".join(
        f"{results[n]['dedup']['rss_mb'] / results[n]['mb']:.2f}x" for n in sizes))
    if not ray:
        return
    print("\ndedup on Ray (2 CPUs) vs local (1 worker); CPU of the process tree "
          "(and of the whole machine)")
    print(f"{'docs':>9} {'identical':>9} {'wall local':>10} {'wall ray':>9} "
          f"{'docs/CPU-s local':>22} {'docs/CPU-s ray':>22} {'Ray CPU overhead':>16}")
    for n, r in results.items():
        local, on_ray = r["dedup"], r["dedup_ray"]
        print(f"{n:>9,} {'yes' if r['ray_identical'] else 'NO':>9} {local['wall_s']:>9.1f}s "
              f"{on_ray['wall_s']:>8.1f}s {n / local['tree_cpu_s']:>10,.0f} "
              f"({n / local['machine_cpu_s']:>8,.0f}) {n / on_ray['tree_cpu_s']:>10,.0f} "
              f"({n / on_ray['machine_cpu_s']:>8,.0f}) "
              f"{on_ray['tree_cpu_s'] / local['tree_cpu_s'] - 1:>+7.0%} "
              f"({on_ray['machine_cpu_s'] / local['machine_cpu_s'] - 1:+.0%})")
        if not r["ray_processes"]:
            print(f"{'':>9} no process ran under the Ray run's driver: Ray was not started, "
                  "the tasks ran in the driver")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="50000,200000,800000", help="documents, comma-separated")
    ap.add_argument("--reps", type=int, default=1, help="runs of each command (median printed)")
    ap.add_argument("--ray", action=argparse.BooleanOptionalAction, default=True,
                    help="also dedup on a local Ray cluster of 2 CPUs")
    ap.add_argument("--work", type=Path, default=Path("/tmp/llmkit-scale"),
                    help="corpora (kept for reruns), workspaces and logs")
    ap.add_argument("--part-docs", type=int, default=25_000,
                    help="documents per jsonl file, hence per raw part (at least 4 parts)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write every figure to this file")
    ap.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                    help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.reps, args.ray, args.work = "2000", 1, False, Path("/tmp/llmkit-scale-quick")
    args.work = args.work.resolve()
    sizes = sorted(int(s) for s in args.sizes.split(","))

    print(f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}, "
          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}; rates per CPU second of "
          "the command's process (wait4), medians of --reps with (min–max)")
    results, tokenizer = {}, None
    for i, n in enumerate(sizes):
        results[n], tokenizer = measure_size(n, args, tokenizer, warm_up=i == 0)
    print_report(results, args.ray)
    print(f"\nload average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps({"sizes": sizes, "reps": args.reps, "results": results,
                                         "flat": {c: flatness(results, c) for c in COMMANDS}},
                                        indent=1))
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
