"""Benchmark: `llmkit tokenize` (the whole command) against sentencepiece's own encoders.

Corpus: the demo corpus's documents (English and Chinese) remixed — documents of a few
passages, each a run of lines of a random demo document — up to --mb megabytes, ingested as a
dataset. The tokenizer is trained on the original demo corpus (as one would: on a sample).

Timed on the same texts:
* `llmkit tokenize --workers N` in a fresh process: start-up, parquet reading, encoding,
  train/val split, shard and index writing;
* sentencepiece's best use, `SentencePieceProcessor.encode(list_of_texts, num_threads=N)`,
  with the texts already in memory and nothing written (so its figures flatter it);
* a plain per-document loop `[sp.encode(t) for t in texts]`;
* llmkit's chunk-cache encoder alone, in this process.
Each is reported by wall clock and by CPU time (the command's and its threads'); on a busy
machine only the CPU-time ratios mean something. `--workers N` keeps one thread for reading
and writing and encodes in N - 1 (N = 1: one thread does all).

The first run on a machine compiles the chunk-cache encoder's passes (llmkit.tokenizers.chunk_cache, about
20 s, once); each figure is the faster of two runs, so that compilation is left out.


The chunk cache's gain grows with the corpus: a chunk seen before is a table lookup. The
remixed demo text repeats its words as any large corpus does, but holds fewer distinct words
than real web text of the same size.

    python bench/tokenize.py [--mb 24] [--workers 1 2] [--vocab-size 8000]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# this file's name shadows the standard library's `tokenize` (which pandas, via pyarrow,
# imports): take bench/ off the path that Python puts first
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
DEMO = ROOT / "recipes" / "demo" / "data" / "raw"
LLMKIT = [sys.executable, "-m", "llmkit"]


def demo_records() -> list[dict]:
    out = []
    for f in sorted(DEMO.glob("*.jsonl*")):
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("text"), str) and rec["text"]:
                    out.append(rec)
    return out


def remix(records: list[dict], megabytes: float, seed: int = 0) -> list[dict]:
    """Documents of 1–12 passages, each a run of lines of a random demo document: about the
    2 KB of a web page, in the demo's mix of English and Chinese."""
    rng = random.Random(seed)
    lines = [r["text"].splitlines(keepends=True) for r in records]
    out, size = [], 0
    while size < megabytes * 1e6:
        passages, sources = [], []
        for _ in range(rng.randint(1, 12)):
            src = rng.randrange(len(records))
            a = rng.randrange(len(lines[src]))
            passages.append("".join(lines[src][a:a + rng.randint(3, 40)]).rstrip("\n"))
            sources.append(records[src].get("source") or "demo")
        text = "\n\n".join(passages)
        out.append({"id": f"mix-{len(out):07d}", "text": text, "source": sources[0]})
        size += len(text.encode())
    return out


def run(args: list) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and its worker processes)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(LLMKIT + [str(a) for a in args], capture_output=True, text=True,
                       cwd=ROOT)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"llmkit {' '.join(map(str, args))} failed:\n{r.stdout}\n{r.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def timed(fn, repeat: int = 2):
    """(result, wall seconds, CPU seconds of this process and its threads) of the fastest of
    `repeat` runs."""
    best = None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        run = (out, time.perf_counter() - t, time.process_time() - c)
        best = run if best is None or run[1] < best[1] else best
    return best


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=24.0, help="corpus size in MB of UTF-8 text")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                    help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    args = ap.parse_args()
    if args.quick:
        args.mb, args.workers, args.vocab_size = 1.0, [1], 2000

    import pyarrow.parquet as pq

    from llmkit.tokenizers.sentencepiece import Tokenizer

    tmp = Path(tempfile.mkdtemp(prefix="bench-tokenize-"))
    ws = tmp / "ws"
    records = demo_records()
    corpus = remix(records, args.mb)
    run(["ingest", write_jsonl(tmp / "demo.jsonl", records), "-w", ws, "--out", "demo"])
    run(["ingest", write_jsonl(tmp / "corpus.jsonl", corpus), "-w", ws, "--out", "corpus"])
    run(["tokenizer", "-w", ws, "--in", "demo", "--set", f"vocab_size={args.vocab_size}"])
    texts = [t for f in sorted((ws / "corpus").glob("part-*.parquet"))
             for t in pq.read_table(f, columns=["text"]).column("text").to_pylist()]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    tok = Tokenizer(ws / "tokenizer")
    sp = tok.sp
    print(f"corpus: {len(texts):,} documents, {mb:.1f} MB "
          f"({sum(len(t) for t in texts) / 1e6:.1f} M characters), vocab {tok.vocab_size}, "
          f"{os.cpu_count()} CPUs")

    rows = []  # (what, wall s, CPU s)
    loop, wall, cpu = timed(lambda: [sp.encode(x) for x in texts], repeat=1)
    n_tokens = sum(map(len, loop))
    rows.append(("sentencepiece per-document loop", wall, cpu))
    del loop
    sp_s = {}
    for n in args.workers:
        batch, wall, cpu = timed(lambda: sp.encode(texts, num_threads=n))
        assert sum(map(len, batch)) == n_tokens
        sp_s[n] = (wall, cpu)
        rows.append((f"sentencepiece encode(list, num_threads={n})", wall, cpu))
    del batch
    def encode_in_batches():  # as the stage does, with a fresh cache
        fresh = Tokenizer(ws / "tokenizer")
        return sum(len(fresh.encode_flat(texts[i:i + 1024])[0])
                   for i in range(0, len(texts), 1024)), fresh

    (n_ours, fresh), wall, cpu = timed(encode_in_batches)
    assert n_ours == n_tokens
    rows.append(("llmkit chunk-cache encoder, in process, no I/O", wall, cpu))
    chunks = fresh._encoder.cached_chunks

    ours = {}
    for n in args.workers:
        out = f"tokens_w{n}"
        ours[n] = min(run(["tokenize", "-w", ws, "--in", "corpus", "--out", out,
                           "--workers", n, "--force"]) for _ in range(2))
        rows.append((f"llmkit tokenize --workers {n} (whole command)", *ours[n]))
        stats = json.loads((ws / out / "manifest.json").read_text())["stats"]
        assert stats["tokens"] - stats["docs"] == n_tokens, "ids differ from sentencepiece's"

    print(f"\n{'':48} {'wall s':>7} {'CPU s':>7} {'MB/s':>6} {'Mtok/s':>6} {'MB/CPU-s':>8}")
    for name, wall, cpu in rows:
        print(f"{name:48} {wall:7.2f} {cpu:7.2f} {mb / wall:6.2f} {n_tokens / wall / 1e6:6.2f} "
              f"{mb / cpu:8.2f}")
    print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall-clock ratios "
          "are only meaningful on an idle machine; CPU-time ratios hold under load)")
    for n in args.workers:
        (w_sp, c_sp), (w_us, c_us) = sp_s[n], ours[n]
        print(f"workers={n}: llmkit tokenize vs sentencepiece encode(list, num_threads={n}): "
              f"{w_sp / w_us:.2f}x by wall clock, {c_sp / c_us:.2f}x by CPU time")
    print(f"chunk cache: {chunks:,} chunks kept, for "
          f"{sum(len(t.split()) for t in texts):,} whitespace-separated words in the corpus")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
