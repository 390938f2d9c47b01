"""Benchmark: `llmkit dedup` (exact / simhash / minhash) against datasketch and rensa.

A planted corpus (originals, exact copies, copies with 3–10 % of words edited, look-alikes
sharing a 30–60 % prefix, unrelated documents; ~300 words each) is written as a `clean`
dataset. Each llmkit method runs as the whole stage (`llmkit dedup`, parquet in and out) in a
fresh process on one worker; the peers run in this process on the same texts, the way their
users ordinarily call them:

* datasketch: `MinHash.update` per shingle, `MinHashLSH` with the same threshold and the
  same false-positive/negative weights (so the same bands × rows), query then insert;
* rensa: `RMinHash.update(shingles)` per document and `RMinHashLSH` with the same bands ×
  rows, query then insert.

Peers shingle in Python (lower-cased word 3-grams), as their users do. Printed: docs/s, MB/s,
peak RSS, pair precision/recall against the planted truth, and the speed ratios.

    python bench/dedup.py [--docs 50000] [--datasketch-docs 5000] [--llmkit-only]
                          [--methods minhash]
"""

from __future__ import annotations

import sys

# the repository root, not bench/, goes on the path: bench/tokenize.py would shadow the
# standard library's tokenize (which pandas, imported by pyarrow, needs)
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmkit.data.dedup.minhash import MinHashConfig  # noqa: E402
from llmkit.data.dedup.planted import pair_scores, planted_corpus  # noqa: E402

# run inside the child: the whole stage as `llmkit dedup` runs it, then report time and RSS
CHILD = """
import json, sys, time
def peak_rss_mb():
    # VmHWM, not ru_maxrss: the latter carries the parent's size across fork + exec
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

t0 = time.perf_counter()
from llmkit.cli.app import build_app
app = build_app()
t1, c1 = time.perf_counter(), time.process_time()
try:
    app(sys.argv[1:], standalone_mode=False)
finally:
    t2, c2 = time.perf_counter(), time.process_time()
    print("BENCH" + json.dumps({"import_s": t1 - t0, "stage_s": t2 - t1, "cpu_s": c2 - c1,
          "peak_rss_mb": peak_rss_mb()}))
"""


@dataclass
class Result:
    name: str
    docs: int
    seconds: float      # wall clock
    cpu_seconds: float  # this process's CPU time: the per-core cost on a busy machine
    precision: float
    recall: float
    peak_rss_mb: float | None = None
    note: str = ""

    @property
    def rate(self) -> float:
        return self.docs / self.seconds

    @property
    def cpu_rate(self) -> float:
        return self.docs / self.cpu_seconds


def build_corpus(n_docs: int, seed: int):
    # per original: 1 + 0.3 exact + 1.0 edited + 0.3 look-alike ≈ 2.6 documents
    n_originals = max(1, int(n_docs * 0.25))
    corpus = planted_corpus(n_originals, unique=max(0, n_docs - int(n_originals * 2.6)),
                            seed=seed)
    return corpus


def write_clean(ws: Path, corpus) -> int:
    import pyarrow as pa

    from llmkit.data.io import DatasetWriter
    from llmkit.core.workspace import Workspace

    @dataclass
    class Planted:
        docs: int

    b = Workspace(ws).builder("clean", stage="clean", config=Planted(len(corpus)), quiet=True)
    with b:
        w = DatasetWriter(b.dir)
        w.write(pa.table({"id": [f"doc{i}" for i in range(len(corpus))], "text": corpus.texts,
                          "source": ["bench"] * len(corpus)}))
        w.close()
    return sum(len(t.encode()) for t in corpus.texts)


def run_llmkit(ws: Path, method: str, corpus) -> Result:
    out = f"dedup-{method}"
    cmd = [sys.executable, "-c", CHILD, "dedup", "-w", str(ws), "--method", method,
           "--out", out, "--force"]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"llmkit dedup --method {method} failed:\n{proc.stdout}\n{proc.stderr}")
    report = json.loads(proc.stdout.split("BENCH")[-1])
    labels = predicted_labels_llmkit(ws / out, len(corpus))
    precision, recall = pair_scores(corpus.truth, labels)
    return Result(f"llmkit {method}", len(corpus), report["stage_s"], report["cpu_s"],
                  precision, recall, report["peak_rss_mb"],
                  f"process wall {wall:.1f}s incl. start-up/imports {report['import_s']:.1f}s")


def predicted_labels_llmkit(artifact: Path, n: int) -> np.ndarray:
    from llmkit.data.io import read_table

    labels = np.arange(n)
    removed = read_table(artifact / "removed", columns=["id", "duplicate_of"])
    for doc, kept in zip(removed.column("id").to_pylist(),
                         removed.column("duplicate_of").to_pylist()):
        labels[int(doc[3:])] = int(kept[3:])
    return labels


_WORD = re.compile(r"\w+")


def word_shingles(text: str, n: int = 3) -> list[str]:
    words = _WORD.findall(text.lower())
    if len(words) < n:
        return [" ".join(words)]
    return [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]


def run_datasketch(texts: list[str], truth, mh: MinHashConfig) -> tuple[Result, tuple]:
    from datasketch import MinHash, MinHashLSH

    weights = (mh.false_positive_weight, mh.false_negative_weight)
    started, cpu = time.perf_counter(), time.process_time()
    lsh = MinHashLSH(threshold=mh.threshold, num_perm=mh.num_perm, weights=weights)
    links = []
    for i, text in enumerate(texts):
        m = MinHash(num_perm=mh.num_perm)
        for shingle in word_shingles(text):
            m.update(shingle.encode("utf-8"))
        links.extend((i, j) for j in lsh.query(m))
        lsh.insert(i, m)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    precision, recall = pair_scores(truth, labels_from_links(len(texts), links))
    return (Result("datasketch", len(texts), seconds, cpu, precision, recall),
            (lsh.b, lsh.r))


def run_rensa(texts: list[str], truth, bands: int, rows: int) -> Result:
    from rensa import RMinHash, RMinHashLSH

    started, cpu = time.perf_counter(), time.process_time()
    num_perm = bands * rows
    lsh = RMinHashLSH(threshold=0.5, num_perm=num_perm, num_bands=bands)
    links = []
    for i, text in enumerate(texts):
        m = RMinHash(num_perm=num_perm, seed=42)
        m.update(word_shingles(text))
        links.extend((i, j) for j in lsh.query(m))
        lsh.insert(i, m)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    precision, recall = pair_scores(truth, labels_from_links(len(texts), links))
    return Result("rensa", len(texts), seconds, cpu, precision, recall,
                  note=f"{bands} bands × {rows} rows = {num_perm} permutations")


def labels_from_links(n: int, links) -> np.ndarray:
    from llmkit.data.dedup import unionfind

    parent = unionfind.new_parents(n)
    for i, j in links:
        unionfind.union(parent, i, j)
    return unionfind.roots(parent)


def fineweb_recall(corpus) -> tuple[float, float]:
    """Pair precision/recall of FineWeb's MinHash settings (word 5-grams, 14 bands × 8 rows,
    band collisions taken as duplicates) on the same corpus, with llmkit's kernels."""
    import pyarrow as pa

    from llmkit.data.dedup.minhash import MinHashConfig
    from llmkit.data.dedup.shingles import ShingleConfig
    from llmkit.data.dedup.sketch import Sketcher, cluster_in_memory
    from llmkit.data.dedup.stage import DedupConfig

    cfg = DedupConfig(minhash=MinHashConfig(num_perm=112, bands=14, rows=8, threshold=0.8,
                                            verify=False,
                                            shingles=ShingleConfig(word_ngram=5)))
    sketcher = Sketcher(cfg)
    labels, _ = cluster_in_memory(sketcher(pa.array(corpus.texts)), sketcher)
    return pair_scores(corpus.truth, labels)


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel once, outside the timings."""
    import pyarrow as pa

    from llmkit.data.dedup.sketch import Sketcher, cluster_in_memory
    from llmkit.data.dedup.stage import DedupConfig

    texts = pa.array(["warm up the kernels", "warm up the kernels", "中文 文本"])
    for method in ("exact", "simhash", "minhash"):
        sketcher = Sketcher(DedupConfig(method=method))
        cluster_in_memory(sketcher(texts), sketcher)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=50_000)
    ap.add_argument("--datasketch-docs", type=int, default=5_000,
                    help="datasketch runs on this many documents; its rate is per document")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default="exact,simhash,minhash",
                    help="llmkit methods to run, comma-separated")
    ap.add_argument("--llmkit-only", action="store_true",
                    help="skip datasketch and rensa (quick checks of llmkit's side)")
    ap.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                    help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    args = ap.parse_args()
    if args.quick:
        args.docs, args.datasketch_docs = 2_000, 500
    methods = args.methods.split(",")

    t = time.perf_counter()
    corpus = build_corpus(args.docs, args.seed)
    print(f"corpus: {len(corpus):,} documents generated in {time.perf_counter() - t:.1f}s")
    warm_up()
    with tempfile.TemporaryDirectory(prefix="llmkit-bench-dedup-") as tmp:
        ws = Path(tmp) / "ws"
        text_bytes = write_clean(ws, corpus)
        mb = text_bytes / 1e6
        print(f"corpus text: {mb:.1f} MB ({text_bytes / len(corpus):.0f} bytes/doc); "
              f"one worker per tool\n")
        results = [run_llmkit(ws, m, corpus) for m in methods]
    if args.llmkit_only:
        print_results(results, text_bytes, len(corpus))
        if "minhash" in methods:
            print_peak(results[methods.index("minhash")], mb)
        return
    mh = MinHashConfig()
    subset = min(args.datasketch_docs, len(corpus))
    sub_corpus = build_corpus(subset, args.seed) if subset < len(corpus) else corpus
    ds, (bands, rows) = run_datasketch(sub_corpus.texts, sub_corpus.truth, mh)
    if subset < len(corpus):
        ds.note = (f"measured on {subset:,} documents of the same make-up; rate extrapolated "
                   "per document")
    results.append(ds)
    results.append(run_rensa(corpus.texts, corpus.truth, bands, rows))

    print_results(results, text_bytes, len(corpus))
    minhash = results[methods.index("minhash")]
    print(f"\nLSH: {bands} bands × {rows} rows (threshold {mh.threshold}, weights "
          f"{mh.false_positive_weight}/{mh.false_negative_weight}) for llmkit, datasketch, rensa")
    rensa = results[-1]
    print(f"llmkit minhash / datasketch: {minhash.rate / ds.rate:.1f}x wall, "
          f"{minhash.cpu_rate / ds.cpu_rate:.1f}x per CPU second")
    print(f"llmkit minhash / rensa:      {minhash.rate / rensa.rate:.2f}x wall, "
          f"{minhash.cpu_rate / rensa.cpu_rate:.2f}x per CPU second")
    precision, recall = fineweb_recall(corpus)
    print(f"FineWeb's settings (word 5-grams, 14×8, no verification) on this corpus: "
          f"precision {precision:.4f}, recall {recall:.4f}")
    print_peak(minhash, mb)


def print_results(results: list[Result], text_bytes: int, n_docs: int) -> None:
    print(f"{'tool':<16} {'docs/s':>8} {'MB/s':>6} {'docs/cpu-s':>10} {'peak RSS':>9} "
          f"{'precision':>9} {'recall':>7}  note")
    for r in results:
        rss = f"{r.peak_rss_mb:.0f} MB" if r.peak_rss_mb else "-"
        print(f"{r.name:<16} {r.rate:>8,.0f} {r.rate * text_bytes / n_docs / 1e6:>6.1f} "
              f"{r.cpu_rate:>10,.0f} {rss:>9} {r.precision:>9.4f} {r.recall:>7.4f}  {r.note}")


def print_peak(minhash: Result, mb: float) -> None:
    print(f"peak RSS of llmkit minhash: {minhash.peak_rss_mb:.0f} MB for a corpus of "
          f"{mb:.0f} MB of text ({minhash.peak_rss_mb / mb:.2f}x; a process that has only "
          f"loaded the CLI, pyarrow and the stage's kernels is ~{baseline_rss_mb():.0f} MB "
          "of it)")


def baseline_rss_mb() -> float:
    """Peak RSS of a process that has loaded the CLI, pyarrow and the stage's kernels, and
    done nothing else."""
    code = ("import pyarrow as pa, pyarrow.parquet\n"
            "from llmkit.cli.app import build_app\n"
            "build_app()\n"
            "from llmkit.data.dedup.sketch import Sketcher, cluster_in_memory\n"
            "from llmkit.data.dedup.stage import DedupConfig\n"
            "s = Sketcher(DedupConfig())\n"
            # a string array from buffers: converting Python objects would import pandas
            "texts = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer("
            "bytes([0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0])), pa.py_buffer(b'ab')])\n"
            "cluster_in_memory(s(texts), s)\n" + CHILD.split("t0 =")[0]
            + "print(peak_rss_mb())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else float("nan")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
