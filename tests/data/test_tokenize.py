import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.tokenize import token_dtype, val_mask
from llmkit.tokenizer import Tokenizer
from tests.conftest import write_jsonl
from tests.test_tokenizer import EDGE_CASES, small_corpus


def llmkit(*args):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """Two datasets (a: two sources, b: one) and a tokenizer trained on both."""
    tmp = tmp_path_factory.mktemp("tokenize")
    docs = small_corpus(160) + EDGE_CASES
    rows_a = [{"id": f"a{i}", "text": t, "source": "code" if i % 4 == 1 else "prose"}
              for i, t in enumerate(docs[:100])]
    rows_b = [{"id": f"b{i}", "text": t} for i, t in enumerate(docs[100:])]
    ws = tmp / "ws"
    llmkit("ingest", write_jsonl(tmp / "a.jsonl", rows_a), "-w", ws, "--out", "a")
    llmkit("ingest", write_jsonl(tmp / "b.jsonl", rows_b), "-w", ws, "--out", "b",
           "--source", "web")
    llmkit("tokenizer", "-w", ws, "--in", "a", "--in", "b", "--set", "vocab_size=400")
    llmkit("tokenize", "-w", ws, "--in", "a", "--in", "b", "--set", "val_fraction=0.2")
    kept = {r["id"]: r["text"] for name in ("a", "b")  # what ingest kept (it drops empty text)
            for f in sorted((ws / name).glob("part-*.parquet"))
            for r in pq.read_table(f).to_pylist()}
    return ws, kept


def read_split(tokens: Path, split: str):
    """(tokens of every shard, index rows of the split with their shard number)."""
    stats = json.loads((tokens / "manifest.json").read_text())["stats"]
    arrays, rows = [], []
    for k, b in enumerate(sorted((tokens / split).glob("shard-*.bin"))):
        arrays.append(np.fromfile(b, dtype=stats["dtype"]))
        for r in pq.read_table(tokens / "index" / f"{b.stem}.parquet").to_pylist():
            if r["split"] == split:
                rows.append({**r, "shard": k})
    return arrays, rows


def test_shards_hold_each_documents_encoding_followed_by_eos(ws):
    root, texts = ws
    tok = Tokenizer(root / "tokens" / "tokenizer")
    seen = []
    for split in ("train", "val"):
        arrays, rows = read_split(root / "tokens", split)
        for r in rows:
            got = arrays[r["shard"]][r["offset"]:r["offset"] + r["length"]].tolist()
            assert got == tok.encode(texts[r["id"]]) + [tok.eos_id], r["id"]
        for k, arr in enumerate(arrays):  # documents tile each shard with no gap
            mine = [r for r in rows if r["shard"] == k]
            assert sum(r["length"] for r in mine) == len(arr)
        seen += [(split, r["id"]) for r in rows]
    ids = [i for _, i in seen]
    assert sorted(ids) == sorted(texts)  # every document exactly once
    in_val = dict(zip(texts, val_mask(list(texts), 0.2, 0)))
    assert all(in_val[i] == (split == "val") for split, i in seen)
    assert 0 < sum(in_val.values()) < len(texts)


def test_manifest_counts_tokens_per_split_and_source(ws):
    root, _ = ws
    stats = json.loads((root / "tokens" / "manifest.json").read_text())["stats"]
    total = 0
    for split in ("train", "val"):
        arrays, rows = read_split(root / "tokens", split)
        n = sum(map(len, arrays))
        by_source = {}
        for r in rows:
            by_source[r["source"]] = by_source.get(r["source"], 0) + r["length"]
        assert stats["splits"][split]["tokens"] == n
        assert stats["splits"][split]["docs"] == len(rows)
        assert stats["splits"][split]["tokens_by_source"] == by_source
        total += n
    assert stats["tokens"] == total
    assert set(stats["tokens_by_source"]) == {"code", "prose", "web"}
    assert stats["dtype"] == "uint16" and stats["vocab_size"] == 400 and stats["shards"] == 2
    assert (root / "tokens" / "tokenizer" / "tokenizer.model").is_file()


def snapshot(tokens: Path) -> dict:
    return {str(p.relative_to(tokens)): (p.read_bytes() if p.suffix == ".bin" else
                                         pq.read_table(p).to_pylist())
            for p in sorted(tokens.glob("*/shard-*"))}  # .bin files and indexes


def test_output_is_identical_for_any_workers_and_rank_split(ws):
    root, _ = ws
    want = snapshot(root / "tokens")
    common = ["-w", root, "--in", "a", "--in", "b", "--set", "val_fraction=0.2"]
    for workers in (2, 3):  # one encoder thread; two, whose chunk caches share misses
        llmkit("tokenize", *common, "--out", f"workers_{workers}", "--workers", workers,
               "--set", "batch_rows=7", "--set", "task_bytes=300")  # many small tasks
        assert snapshot(root / f"workers_{workers}") == want

    r0 = llmkit("tokenize", *common, "--out", "ranked", "--rank", "0", "--world-size", "2")
    assert "rank 0/2" in r0.output and not (root / "ranked" / "manifest.json").exists()
    llmkit("tokenize", *common, "--out", "ranked", "--rank", "1", "--world-size", "2")
    llmkit("tokenize", *common, "--out", "ranked")  # assembles the two ranks' shards
    assert snapshot(root / "ranked") == want


def test_token_dtype_widens_past_65535():
    assert token_dtype(65535) == "uint16" and token_dtype(65536) == "uint32"
