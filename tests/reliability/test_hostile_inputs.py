"""Hostile files into `ingest` and on through `clean`: exit 0 with bad rows quarantined, or
exit 2 naming the file when nothing is left — never a traceback — and every record the file
holds counted: read = kept + quarantined at every stage."""

import gzip
import json
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app

GOOD = {"text": "A real sentence about the weather, long enough to be a document. " * 12}


def _jsonl(*records) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records)


TRUNCATED = gzip.compress(_jsonl(*[{"text": f"document {i} " * 40} for i in range(2000)]))[:3000]
# the whole lines that survive the cut; the cut-off rest is one quarantined `truncated_file` row
TRUNCATED_LINES = zlib.decompressobj(31).decompress(TRUNCATED).count(b"\n")

# name: (content, records in it as counted by hand, records ingest keeps)
HOSTILE = {
    "gbk.txt": ("春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。".encode("gb18030"), 1, 1),  # detected
    "nul.jsonl": (_jsonl(GOOD, {"text": "before\x00after " * 30}), 2, 2),
    "binary.txt": (bytes(range(256)) * 64, 1, 0),
    "empty.jsonl": (b"", 0, 0),
    "huge.jsonl": (_jsonl({"text": ("twenty megabytes of words " * 800_000)[:20_000_000]}), 1, 1),
    # the unclosed quote runs to the end of the file: one malformed record, as csv reads it
    "broken.csv": (b'text,lang\n"an unclosed quote,en\nfine row,en\n', 1, 0),
    "typed.jsonl": (_jsonl(GOOD, {"text": 42}, {"text": {"a": 1}}, {"text": ["x"]}, [1, 2]), 5, 1),
    "truncated.jsonl.gz": (TRUNCATED, TRUNCATED_LINES + 1, TRUNCATED_LINES),
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
def test_hostile_file_is_quarantined_or_refused_and_every_record_is_counted(tmp_path, name):
    data, records, kept = HOSTILE[name]
    path = tmp_path / name
    path.write_bytes(data)
    ws = tmp_path / "ws"
    r = invoke("ingest", path, "-w", ws)
    if not kept:  # nothing readable: refused, naming the file, and nothing written
        assert r.exit_code == 2 and name in r.output, r.output
        assert not (ws / "raw").exists()
        r = invoke("ingest", path, "-w", ws, "--set", "allow_empty=true")
    assert r.exit_code == 0, r.output
    stats = manifest(ws, "raw")["stats"]
    assert stats["records_in"] == stats["rows_in"] == records
    assert (stats["rows_out"], stats["rows_removed"]) == (kept, records - kept)
    r = invoke("clean", "-w", ws, "--set", "allow_empty=true")
    assert r.exit_code == 0, r.output
    stats = manifest(ws, "clean")["stats"]
    assert stats["rows_in"] == kept == stats["rows_out"] + stats["rows_removed"]


def test_parquet_without_the_text_column_exits_2_naming_the_file_and_the_column(tmp_path):
    path, ws = tmp_path / "wrong.parquet", tmp_path / "ws"
    pq.write_table(pa.table({"body": ["no text column here", "nor here"]}), path)
    r = invoke("ingest", path, "-w", ws)
    assert r.exit_code == 2
    assert "wrong.parquet" in r.output and "2 × missing text field 'text'" in r.output
    assert "records have: body" in r.output and "--text-field body" in r.output
    assert not (ws / "raw").exists()
    r = invoke("ingest", path, "-w", ws, "--set", "allow_empty=true")
    removed = pq.read_table(ws / "raw" / "removed").to_pylist()
    assert [(x["reason"], x["location"]) for x in removed] == [
        ("missing_text", "wrong.parquet#0"), ("missing_text", "wrong.parquet#1")]
    r = invoke("ingest", path, "-w", ws, "--set", "text_field=body", "--force")
    assert r.exit_code == 0 and manifest(ws, "raw")["stats"]["rows_out"] == 2


def test_not_a_parquet_file_exits_2_naming_it(tmp_path):
    path = tmp_path / "fake.parquet"
    path.write_bytes(b"this is not parquet at all")
    r = invoke("ingest", path, "-w", tmp_path / "ws")
    assert r.exit_code == 2 and "fake.parquet" in r.output
