"""Data stages stream: peak memory does not grow with the corpus."""

import gzip
import json
import subprocess
import sys

import pytest

RSS_BOUND_MB = 400  # interpreter + pyarrow + a few batches; the corpus is ~10x the demo (>40 MB)


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
def test_ingest_and_clean_of_ten_demo_corpora_stay_under_the_rss_bound(tmp_path):
    path = tmp_path / "big.jsonl"
    corpus(path, 100_000)
    size_mb = path.stat().st_size / 2**20
    assert size_mb > 40
    ws = tmp_path / "ws"
    llmkit = [sys.executable, "-m", "llmkit"]
    assert peak_rss_mb([*llmkit, "ingest", path, "-w", ws]) < RSS_BOUND_MB
    assert peak_rss_mb([*llmkit, "clean", "-w", ws]) < RSS_BOUND_MB
