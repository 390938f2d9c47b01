import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.token_shards import token_dtype
from llmkit.data.tokenize import val_mask
from llmkit.tokenizers.sentencepiece import Tokenizer
from tests.conftest import write_jsonl
from tests.tokenizers.test_sentencepiece import EDGE_CASES, small_corpus


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


def damage(shard: Path, how: str) -> None:
    """Spoil a finished shard of the work folder the way a crash or a person might."""
    marker = shard.with_name(shard.name + ".done")
    if how == "file removed":
        (shard / "val.bin").unlink()
    elif how == "file cut short":
        data = (shard / "train.bin").read_bytes()
        (shard / "train.bin").write_bytes(data[:len(data) // 2])
    elif how == "marker torn":
        marker.write_text(marker.read_text()[:20])
    else:  # stats that disagree with the files
        info = json.loads(marker.read_text())
        info["stats"]["train"]["tokens"] += 1
        marker.write_text(json.dumps(info))


@pytest.mark.parametrize("how,state", [
    ("file removed", "damaged"), ("file cut short", "damaged"), ("marker torn", "damaged"),
    ("stats disagree", "partial")])  # status checks the files, tokenize their contents too
def test_a_damaged_shard_of_a_rank_split_is_rebuilt_to_the_straight_artifact(ws, how, state,
                                                                           monkeypatch):
    import llmkit.data.tokenize as tokenize

    root, _ = ws
    out = f"split_{how.replace(' ', '_')}"
    common = ["-w", root, "--in", "a", "--in", "b", "--set", "val_fraction=0.2", "--out", out]
    for rank in (0, 1):
        llmkit("tokenize", *common, "--rank", rank, "--world-size", 2)
    [work] = (root / ".work").glob(f"{out}-*")
    damage(work / "shard-00001", how)

    status = llmkit("status", "-w", root).output
    row = next(line for line in status.splitlines() if line.startswith(f"{out} (work)"))
    assert row.split()[2:4] == ["tokenize", state]
    if state == "damaged":
        assert "1 of 2 shards, 1 damaged" in row
        assert "rerun `llmkit tokenize`" in status

    rebuilt = []
    real = tokenize.tokenize_shard
    monkeypatch.setattr(tokenize, "tokenize_shard",
                        lambda part, source, shard_dir, *a, **k:
                        rebuilt.append(shard_dir.name) or real(part, source, shard_dir, *a, **k))
    llmkit("tokenize", *common)
    assert rebuilt == ["shard-00001"]  # the intact shard is reused, the damaged one redone
    assert snapshot(root / out) == snapshot(root / "tokens")
    stats = [json.loads((root / name / "manifest.json").read_text())["stats"]
             for name in (out, "tokens")]
    assert stats[0] == stats[1]
    assert not work.exists()  # the work folder goes once the artifact is in place


def test_a_shard_folder_that_cannot_be_replaced_is_an_error_naming_it(ws):
    root, _ = ws
    common = ["-w", root, "--in", "a", "--in", "b", "--out", "blocked"]
    llmkit("tokenize", *common, "--rank", "0", "--world-size", "2")
    [work] = (root / ".work").glob("blocked-*")
    (work / "shard-00001").write_text("not a folder")
    r = CliRunner().invoke(build_app(), ["tokenize", *map(str, common)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert str(work / "shard-00001") in r.output and f"delete {work}" in r.output


def test_an_empty_input_is_refused_down_the_pipeline_unless_allowed(ws, tmp_path):
    ws, _ = ws
    data = write_jsonl(tmp_path / "none.jsonl", [{"id": "x", "body": "no text field"}])
    run = lambda *a: CliRunner().invoke(build_app(), [str(x) for x in a])  # noqa: E731
    assert run("ingest", data, "-w", ws, "--out", "none", "--allow-empty").exit_code == 0
    refused = run("dedup", "-w", ws, "--in", "none", "--out", "none_dedup")
    assert refused.exit_code == 2 and "dedup: no rows in none" in refused.output
    assert not (ws / "none_dedup").exists()
    assert run("dedup", "-w", ws, "--in", "none", "--out", "none_dedup", "--allow-empty").exit_code == 0
    refused = run("tokenize", "-w", ws, "--in", "none_dedup", "--out", "none_tokens")
    assert refused.exit_code == 2 and "none_dedup gave no token (0 documents)" in refused.output
    assert not (ws / "none_tokens").exists()


def test_an_empty_validation_split_is_said_loudly(ws):
    ws, _ = ws
    r = llmkit("tokenize", "-w", ws, "--in", "b", "--out", "tokens_tiny_val", "--set", "val_fraction=0.0001")
    assert "the val split is empty" in r.output
