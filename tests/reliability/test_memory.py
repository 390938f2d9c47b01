"""Data stages stream: peak memory does not grow with the corpus."""

import gzip
import json
import subprocess
import sys

import pytest

N_DOCS = 12_500  # ~6 MB of JSON lines; 4N is ~22 MB, whose text alone would add >16 MB if held
# allowed rise of the peak from N to 4N documents: the allocator's warm-up (measured 1-9 MB with
# pyarrow 26's mimalloc, and 200k documents peak no higher than 50k); holding the text adds > 16
GROWTH_MB = 12.0
RSS_BOUND_MB = 400  # interpreter + pyarrow + a few batches, whatever the corpus


def corpus(path, n_docs: int):
    src = [json.loads(l) for l in gzip.open("recipes/demo/data/raw/en_docstrings.jsonl.gz")]
    src += [json.loads(l) for l in open("recipes/demo/data/raw/zh_prose.jsonl", encoding="utf-8")]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n_docs):
            f.write(json.dumps({"id": str(i), "text": src[i % len(src)]["text"]},
                               ensure_ascii=False) + "\n")


def peak_rss_mb(args) -> float:
    code = ("import resource, subprocess, sys\n"
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True,
                         capture_output=True, text=True).stdout
    return int(out.split()[-1]) / 1024


@pytest.mark.slow
def test_peak_memory_of_ingest_and_clean_does_not_grow_from_n_to_4n_documents(tmp_path):
    llmkit = [sys.executable, "-m", "llmkit"]
    peaks = {}
    for n in (N_DOCS, 4 * N_DOCS):
        path = tmp_path / f"docs-{n}.jsonl"
        corpus(path, n)
        ws = tmp_path / f"ws-{n}"
        # ingest holds one batch of rows: a small one, so that a few batches already show its
        # steady state and what grows with the corpus stands out
        peaks["ingest", n] = peak_rss_mb([*llmkit, "ingest", path, "-w", ws, "--set", "batch_rows=512"])
        peaks["clean", n] = peak_rss_mb([*llmkit, "clean", "-w", ws])
    assert (tmp_path / f"docs-{4 * N_DOCS}.jsonl").stat().st_size > 20 * 2**20
    for stage in ("ingest", "clean"):
        small, large = peaks[stage, N_DOCS], peaks[stage, 4 * N_DOCS]
        assert large - small < GROWTH_MB, (stage, small, large)
        assert large < RSS_BOUND_MB, (stage, large)
