"""Hostile files into `ingest` and on through `clean`: exit 0 with bad rows quarantined, or
exit 2 naming the file — never a traceback — and rows conserved at every stage."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app

GOOD = {"text": "A real sentence about the weather, long enough to be a document. " * 12}


def _jsonl(*records) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records)


HOSTILE = {
    "gbk.txt": "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。".encode("gb18030"),
    "nul.jsonl": _jsonl(GOOD, {"text": "before\x00after " * 30}),
    "binary.txt": bytes(range(256)) * 64,
    "empty.jsonl": b"",
    "huge.jsonl": _jsonl({"text": ("twenty megabytes of words " * 800_000)[:20_000_000]}),
    "broken.csv": b'text,lang\n"an unclosed quote,en\nfine row,en\n',
    "typed.jsonl": _jsonl(GOOD, {"text": 42}, {"text": {"a": 1}}, {"text": ["x"]}, [1, 2]),
    "truncated.jsonl.gz": gzip.compress(_jsonl(*[{"text": f"document {i} " * 40}
                                                 for i in range(2000)]))[:3000],
}


def invoke(*args):
    r = CliRunner().invoke(build_app(), list(map(str, args)))
    assert "Traceback" not in r.output, r.output
    if r.exception and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r


def manifest(ws, name):
    return json.loads((ws / name / "manifest.json").read_text())


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_is_quarantined_or_refused_and_rows_conserved(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(HOSTILE[name])
    ws = tmp_path / "ws"
    r = invoke("ingest", path, "-w", ws)
    assert r.exit_code == 0, r.output
    stats = manifest(ws, "raw")["stats"]
    assert stats["rows_in"] == stats["rows_out"] + stats["rows_removed"]
    if name in ("gbk.txt", "binary.txt", "typed.jsonl", "truncated.jsonl.gz", "broken.csv"):
        assert stats["rows_removed"] >= 1
    r = invoke("clean", "-w", ws)
    assert r.exit_code == 0, r.output
    stats = manifest(ws, "clean")["stats"]
    assert stats["rows_in"] == stats["rows_out"] + stats["rows_removed"]


def test_parquet_with_the_wrong_schema_exits_2_naming_the_file(tmp_path):
    path = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"body": ["no text column here"]}), path)
    r = invoke("ingest", path, "-w", tmp_path / "ws")
    assert r.exit_code == 0
    stats = manifest(tmp_path / "ws", "raw")["stats"]
    assert stats["removed_by_reason"] == {"missing_text": 1}
    r = invoke("ingest", path, "-w", tmp_path / "ws", "--set", "text_field=body", "--force")
    assert r.exit_code == 0 and manifest(tmp_path / "ws", "raw")["stats"]["rows_out"] == 1


def test_not_a_parquet_file_exits_2_naming_it(tmp_path):
    path = tmp_path / "fake.parquet"
    path.write_bytes(b"this is not parquet at all")
    r = invoke("ingest", path, "-w", tmp_path / "ws")
    assert r.exit_code == 2 and "fake.parquet" in r.output
