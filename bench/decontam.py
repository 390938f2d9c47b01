"""Benchmark: `llmkit decontaminate`, the whole command, in MB of text per CPU-second.

A corpus of generated English and Chinese documents (tests/data/decontam_corpus.py: items of
the demo's evaluation files planted verbatim, disguised and edited among documents sharing
short phrases with them) is ingested once; then `llmkit decontaminate --against` every demo
evaluation file runs `--runs` times (--force, one worker, one thread) in a fresh process
each. CPU-seconds are the process's user + system time (imports, index, parquet in and out
included); MB are the UTF-8 bytes of the input's `text` column. Printed: each run, the
median and the spread (max − min), and the removals per kind of planted item.

    python bench/decontam.py [--docs 150000] [--runs 3]
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)  # the repository root, not bench/, on the path

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def llmkit(*args: str) -> float:
    """Run `llmkit ARGS` in a fresh process; its CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", "from llmkit.cli.app import main; main()", *args],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    from tests.data.decontam_corpus import EVAL_FILES, planted_corpus

    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=150_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                    help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    args = ap.parse_args()
    if args.quick:
        args.docs, args.runs = 2_000, 1
    with tempfile.TemporaryDirectory() as tmp:
        rows, planted = planted_corpus(clean_docs=args.docs, per_kind=50)
        corpus = Path(tmp) / "corpus.jsonl"
        with open(corpus, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        megabytes = sum(len(r["text"].encode()) for r in rows) / 1e6
        ws = str(Path(tmp) / "ws")
        llmkit("ingest", str(corpus), "-w", ws, "--out", "docs")
        against = ",".join(map(str, EVAL_FILES))
        llmkit("decontaminate", "--in", "docs", "--against", against, "-w", ws, "--out", "warm")
        seconds = [llmkit("decontaminate", "--in", "docs", "--against", against, "-w", ws,
                          "--force") for _ in range(args.runs)]
        import pyarrow.parquet as pq

        removed = pq.read_table(Path(ws) / "decontaminated" / "removed").column("id").to_pylist()
    speeds = [megabytes / s for s in seconds]
    print(f"{len(rows)} documents, {megabytes:.1f} MB of text")
    for s, v in zip(seconds, speeds):
        print(f"  run: {s:.2f} CPU-s, {v:.1f} MB/CPU-s")
    print(f"median {statistics.median(speeds):.1f} MB/CPU-s, spread {max(speeds) - min(speeds):.1f}")
    found = Counter(planted[d][0] for d in removed if d in planted)
    print(f"removed: {len(removed)} ({sum(d not in planted for d in removed)} clean); recall "
          + ", ".join(f"{k} {found[k]}/50" for k in ("verbatim", "disguised", "edited")))


if __name__ == "__main__":
    main()
