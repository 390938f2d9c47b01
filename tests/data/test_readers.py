"""Ingest's readers are files: one module per format, each in the table that picks a reader by
the file's suffix, and the table covers every format `llmkit ingest` documents."""

import csv
import gzip
import importlib
import io
import json
import pkgutil
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from llmkit.data import ingest, readers
from llmkit.data.ingest import IngestConfig
from llmkit.data.readers import COMPRESSIONS, FORMATS, READERS, SUFFIXES, expand_inputs, format_of
from llmkit.data.readers import read_records


def documented() -> tuple[list[str], list[str]]:
    """(formats, compressions) as ingest's docstring names them on its first line."""
    first = ingest.__doc__.splitlines()[0]
    formats, compressions = re.search(r"`llmkit ingest`: (.*?) \(optionally (.*?)\)", first).groups()
    return formats.split(" / "), compressions.split(" / ")


def reader_modules() -> list[str]:
    return [f"{readers.__name__}.{m.name}" for m in pkgutil.iter_modules(readers.__path__)]


def test_the_suffix_table_covers_every_documented_format_and_compression():
    formats, compressions = documented()
    assert formats == list(FORMATS) and compressions == list(COMPRESSIONS)
    for fmt in formats:
        for packed in ("", *compressions):
            assert format_of(Path(f"Docs.{fmt.upper()}{packed}"), None) == fmt
    assert set(SUFFIXES.values()) == set(READERS)
    assert format_of(Path("notes.md.gz"), None) == "txt" and format_of(Path("a.bin"), None) is None
    assert format_of(Path("a.bin"), "csv") == "csv"  # format= forces it


def test_each_reader_module_is_found_in_the_table_and_each_reader_lives_in_one():
    owners = {reader.__module__ for reader in READERS.values()}
    assert owners == set(reader_modules())  # a module left out of READERS fails here
    for name in reader_modules():
        module = importlib.import_module(name)
        assert any(getattr(module, r.__name__, None) is r for r in READERS.values()), name


def write(path: Path, fmt: str, texts: list[str]) -> Path:
    if fmt == "parquet":
        pq.write_table(pa.table({"text": texts}), path)
        return path
    if fmt == "jsonl":
        data = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    elif fmt == "json":
        data = json.dumps([{"text": t} for t in texts])
    elif fmt == "txt":
        data = "\n".join(texts)
    else:
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows([["text"], *[[t] for t in texts]])
        return path
    path.write_text(data)
    return path


def packed(path: Path, compression: str) -> Path:
    out = path.with_name(path.name + compression)
    data = path.read_bytes()
    out.write_bytes(gzip.compress(data) if compression == ".gz"
                    else zstandard.ZstdCompressor().compress(data))
    return out


WEB_FORMATS = ("warc", "html")  # pages: tests/data/test_web.py reads them in depth


@pytest.mark.parametrize("compression", ["", *COMPRESSIONS])
@pytest.mark.parametrize("fmt", [f for f in FORMATS if f not in ("parquet", *WEB_FORMATS)])
def test_each_text_format_reads_its_records_plain_and_compressed(tmp_path, fmt, compression):
    path = write(tmp_path / f"d.{fmt}", fmt, ["one", "two"])
    path = packed(path, compression) if compression else path
    records = list(read_records(path, IngestConfig(per_line=True)))
    assert [rec["text"] for _, rec in records] == ["one", "two"]
    where = {"jsonl": [":1", ":2"], "json": ["[0]", "[1]"], "txt": [":1", ":2"], "csv": [":2", ":3"]}
    assert [loc for loc, _ in records] == [f"{path}{w}" for w in where[fmt]]


@pytest.mark.parametrize("compression", ["", *COMPRESSIONS])
def test_warc_and_html_read_their_pages_plain_and_compressed(tmp_path, compression):
    from warcio.warcwriter import WARCWriter

    with open(tmp_path / "d.wet", "wb") as f:
        writer = WARCWriter(f, gzip=False)
        for n, text in enumerate(["one", "two"]):
            writer.write_record(writer.create_warc_record(
                f"http://a.org/{n}", "conversion", payload=io.BytesIO(text.encode())))
    (tmp_path / "d.htm").write_text("<html><body><article><p>three</p></article></body></html>")
    wet, htm = (packed(tmp_path / name, compression) if compression else tmp_path / name
                for name in ("d.wet", "d.htm"))
    records = list(read_records(wet, IngestConfig())) + list(read_records(htm, IngestConfig()))
    assert [rec["text"] for _, rec in records] == ["one", "two", "three"]
    assert [loc.rsplit("@", 1)[0] for loc, _ in records[:2]] == [str(wet)] * 2
    assert records[2][0] == str(htm)


def test_parquet_reads_one_record_per_row_in_batches(tmp_path):
    path = write(tmp_path / "d.parquet", "parquet", ["a", "b", "c"])
    records = list(read_records(path, IngestConfig(batch_rows=2)))
    assert records == [(f"{path}#0", {"text": "a"}), (f"{path}#1", {"text": "b"}),
                       (f"{path}#2", {"text": "c"})]


def test_a_folder_expands_to_its_files_of_a_known_format_in_order(tmp_path):
    for name in ("b.jsonl.gz", "a/c.md", "a/skip.bin", "d.parquet"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert expand_inputs([str(tmp_path)]) == [tmp_path / "a/c.md", tmp_path / "b.jsonl.gz",
                                              tmp_path / "d.parquet"]


# ---------------------------------------------------------------- charsets and time limits

POEM = "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。"
POEM_HANT = "春眠不覺曉，處處聞啼鳥。夜來風雨聲，花落知多少。"


def test_gbk_and_big5_text_files_of_every_text_format_are_detected_and_read(tmp_path):
    files = {"a.txt": (POEM * 3).encode("gbk"), "b.txt": (POEM_HANT * 3).encode("big5"),
             "c.jsonl": "".join(json.dumps({"text": POEM * 2 + str(i)}, ensure_ascii=False)
                                + "\n" for i in range(3)).encode("gb18030"),
             "d.csv": f"text,n\n{POEM_HANT * 2},1\n".encode("big5")}
    got = {}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        got[name] = [rec for _, rec in read_records(tmp_path / name, IngestConfig())]
    assert got["a.txt"] == [{"text": POEM * 3, "charset": "gb18030"}]
    assert got["b.txt"] == [{"text": POEM_HANT * 3, "charset": "big5hkscs"}]
    assert [r["text"] for r in got["c.jsonl"]] == [POEM * 2 + str(i) for i in range(3)]
    assert got["d.csv"] == [{"text": POEM_HANT * 2, "n": "1", "charset": "big5hkscs"}]
    assert list(read_records(tmp_path / "a.txt", IngestConfig(per_line=True)))[0][1]["text"] \
        == POEM * 3


def test_an_explicit_encoding_wins_and_undecodable_text_is_quarantined_with_a_reason(tmp_path):
    (tmp_path / "gbk.txt").write_bytes(POEM.encode("gbk"))
    [(_, bad)] = read_records(tmp_path / "gbk.txt", IngestConfig(encoding="utf-8"))
    assert bad.reason == "invalid_utf8"
    latin = "Le café était très bon, à bientôt à la maison, dit-elle à l'été.".encode("cp1252")
    (tmp_path / "latin.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "' + latin + b'"}\n')
    records = [rec for _, rec in read_records(tmp_path / "latin.jsonl", IngestConfig())]
    assert records[0] == {"text": "ok"} and records[1].reason == "invalid_utf8"
    assert read_records(tmp_path / "latin.jsonl", IngestConfig(encoding="cp1252")).__next__()
    with pytest.raises(Exception, match="unknown codec 'no-such'"):
        IngestConfig(encoding="no-such")
