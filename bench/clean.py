"""Benchmark: `llmkit clean` (normalisation + boilerplate lines + quality rules) against datatrove.

The demo corpus (recipes/demo/data/raw) is replicated to `--mb` megabytes of English
(Python docstrings) and of Chinese (poems and prose), every copy a distinct row. llmkit runs
`clean_batch` over pyarrow batches of 2,048 rows in this process, one core, after a warm-up
that loads the compiled kernels and builds the character tables (once per process). The peer
is datatrove's English quality stack, the filters FineWeb applies (GopherRepetitionFilter,
GopherQualityFilter, C4QualityFilter with FineWeb's settings, FineWebQualityFilter), run on
the same English rows in a separate Python that has datatrove installed (`--peer-python`;
its English word tokenizer is spaCy's blank "en" pipeline, which needs no model download).
datatrove does no text normalisation here, so llmkit does strictly more work.

Printed per corpus: rows/s and MB/s of UTF-8 input per core (CPU time, so other load on the
machine inflates the figures less than wall time would), share of rows kept, and the ratio
llmkit / datatrove; and a reference loop's CPU time, to compare machines. With `--repeat N`
llmkit cleans each corpus N times and the median run is printed (of an even N, the slower
middle one), then every run's MB/s: on a shared machine one run can be off by a quarter.

    python bench/clean.py [--mb 30] [--repeat 1] [--peer-python /path/to/venv/bin/python]
                          [--peer-mb 5]

To get a peer: `python -m venv /tmp/dt && /tmp/dt/bin/pip install datatrove spacy`.
"""

from __future__ import annotations

import argparse
import os
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # not bench/, whose tokenize.py would shadow the standard library's
RAW = ROOT / "recipes" / "demo" / "data" / "raw"
BATCH_ROWS = 2048

# Runs in the peer's interpreter: reads texts as JSON lines on stdin, prints one JSON result.
PEER = r"""
import json, sys, time
from datatrove.data import Document
from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter,
                                        GopherQualityFilter, GopherRepetitionFilter)

texts = [json.loads(line) for line in sys.stdin]
filters = [GopherRepetitionFilter(), GopherQualityFilter(),
           C4QualityFilter(filter_no_terminal_punct=False), FineWebQualityFilter()]
def keep(doc):
    for f in filters:
        verdict = f.filter(doc)
        if verdict is not True and (verdict is False or not verdict[0]):
            return False
    return True
keep(Document(text=texts[0], id="warm-up"))
t0 = time.process_time()
kept = sum(keep(Document(text=t, id=str(i))) for i, t in enumerate(texts))
print(json.dumps({"cpu_s": time.process_time() - t0, "kept": kept}))
"""


def read_texts(names: list[str]) -> list[str]:
    texts = []
    for name in names:
        opener = gzip.open if name.endswith(".gz") else open
        with opener(RAW / name, "rt", encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f]
    return texts


def replicate(texts: list[str], megabytes: float) -> list[str]:
    """Copies of the corpus until it holds `megabytes` of UTF-8; each copy's rows differ from
    the others by a numbered first line, as distinct pages of one site would."""
    out, size, copy = [], 0, 0
    while size < megabytes * 1e6:
        for text in texts:
            row = f"Part {copy}.\n{text}"
            out.append(row)
            size += len(row.encode())
            if size >= megabytes * 1e6:
                break
        copy += 1
    return out


def run_llmkit(texts: list[str]) -> dict:
    import pyarrow as pa

    from llmkit.data.clean import CleanConfig, clean_batch

    cfg = CleanConfig()
    table = pa.table({"id": [str(i) for i in range(len(texts))], "text": texts,
                      "source": ["bench"] * len(texts)})
    batches = table.to_batches(max_chunksize=BATCH_ROWS)
    clean_batch(batches[0].slice(0, 64), config=cfg)  # warm-up: kernels, character tables
    kept = 0
    t0 = time.process_time()
    for batch in batches:
        kept += clean_batch(batch, config=cfg)[0].num_rows
    return {"cpu_s": time.process_time() - t0, "kept": kept}


def run_peer(python: str, texts: list[str]) -> dict | None:
    data = "".join(json.dumps(t) + "\n" for t in texts)
    proc = subprocess.run([python, "-c", PEER], input=data, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"peer failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_llmkit_repeated(texts: list[str], repeat: int) -> dict:
    """The median of `repeat` runs (of an even number, the slower middle one), with every
    run's CPU seconds in "runs_cpu_s"."""
    runs = [run_llmkit(texts) for _ in range(repeat)]
    median = sorted(runs, key=lambda r: r["cpu_s"])[repeat // 2]
    return {**median, "runs_cpu_s": [r["cpu_s"] for r in runs]}


def report(name: str, texts: list[str], result: dict) -> float:
    mb = sum(len(t.encode()) for t in texts) / 1e6
    rate = mb / result["cpu_s"]
    print(f"{name:<28} {len(texts):>8,} rows {mb:7.1f} MB  {len(texts) / result['cpu_s']:>9,.0f} rows/s"
          f"  {rate:6.2f} MB/s  kept {result['kept'] / len(texts):6.1%}")
    if len(result.get("runs_cpu_s", [])) > 1:
        rates = [mb / s for s in result["runs_cpu_s"]]
        print(f"{'':<28} {len(rates)} runs, the median one above: {min(rates):.2f} … "
              f"{max(rates):.2f} MB/s ({', '.join(f'{r:.2f}' for r in rates)})")
    return rate


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=30, help="megabytes per language for llmkit")
    ap.add_argument("--repeat", type=int, default=1, help="llmkit runs per corpus (median printed)")
    ap.add_argument("--peer-python", help="a Python with datatrove and spacy installed")
    ap.add_argument("--peer-mb", type=float, default=5, help="megabytes of English for the peer")
    ap.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                    help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    args = ap.parse_args()
    if args.quick:
        args.mb, args.repeat, args.peer_mb = 0.5, 1, 0.5

    english = read_texts(["en_docstrings.jsonl.gz"])
    chinese = read_texts(["zh_poems.jsonl", "zh_prose.jsonl"])
    t0 = time.process_time()
    sum(range(10**7))
    print(f"per core (CPU seconds); batches of {BATCH_ROWS} rows; this machine runs "
          f"sum(range(10**7)) in {time.process_time() - t0:.2f} CPU s (scale figures by it)\n")
    repeat = max(1, args.repeat)
    en_rate = report("llmkit clean, English", en := replicate(english, args.mb),
                     run_llmkit_repeated(en, repeat))
    report("llmkit clean, Chinese", zh := replicate(chinese, args.mb),
           run_llmkit_repeated(zh, repeat))
    if not args.peer_python:
        print("\nno --peer-python given: datatrove not run")
        return
    peer_texts = replicate(english, args.peer_mb)
    peer = run_peer(args.peer_python, peer_texts)
    if peer:
        peer_rate = report("datatrove filters, English", peer_texts, peer)
        print(f"\nllmkit / datatrove on English: {en_rate / peer_rate:.1f}x")


if __name__ == "__main__":
    main()
