"""WARC/WET input is read whole, whatever holds it: one gzip member per record (Common Crawl)
or one for the file (`gzip file.warc`), zstd, plain. Every record is counted once, a record over
`max_page_bytes` is skipped in bounded memory, and a file cut short keeps every record before
the cut. The files are written here with warcio, the reference library."""

import gzip
import io
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import zstandard
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from llmkit.data.ingest import IngestConfig, run_ingest
from llmkit.data.io import BadRecord, read_table
from llmkit.data.readers import read_records

MAX_PAGE = 4096


def warc_record(kind: str, url: str, payload: bytes) -> bytes:
    buf = io.BytesIO()
    w = WARCWriter(buf, gzip=False)
    kw = {"warc_content_type": "text/plain"} if kind == "conversion" else \
        {"http_headers": StatusAndHeaders("200 OK", [("Content-Type", "text/html")],
                                          protocol="HTTP/1.1")} if kind == "response" else {}
    w.write_record(w.create_warc_record(url, kind, payload=io.BytesIO(payload), **kw))
    return buf.getvalue()


def warc_records(n: int, wet: bool, big: int = 0) -> list[bytes]:
    """`n` records as a crawl writes them: WET conversion texts, or request, response (a
    small HTML page) and metadata records in turn; record n // 2 holds `big` bytes when
    asked."""
    out = []
    for i in range(n):
        url, size = f"https://site.example/{i}", big if big and i == n // 2 else 0
        if wet:
            out.append(warc_record("conversion", url, b"word " * (size // 5) if size else
                                   f"Document {i}: a line of text.".encode()))
        elif i % 3 == 1:
            out.append(warc_record("response", url, b"<html><body><p>" + (
                b"x" * size if size else b"Page %d of the crawl." % i) + b"</p></body></html>"))
        else:
            out.append(warc_record("request" if i % 3 == 0 else "metadata", url,
                                   b"GET / HTTP/1.1\r\n\r\n"))
    return out


def pack(records: list[bytes], container: str) -> bytes:
    """The records in one container: `gz` one gzip member for the file, `gz-members` one per
    record, `zst` one zstd frame with a block flushed after each record (as a writer that
    streams does), `plain` none."""
    data = b"".join(records)
    if container == "gz":
        return gzip.compress(data, 1)
    if container == "gz-members":
        return b"".join(gzip.compress(r, 1) for r in records)
    if container == "zst":
        buf = io.BytesIO()
        writer = zstandard.ZstdCompressor().stream_writer(buf, closefd=False)
        for r in records:
            writer.write(r)
            writer.flush(zstandard.FLUSH_BLOCK)
        writer.flush(zstandard.FLUSH_FRAME)
        return buf.getvalue()
    return data


SUFFIX = {"gz": ".gz", "gz-members": ".gz", "zst": ".zst", "plain": ""}
CONTAINERS = [("warc", "gz"), ("warc", "zst"), ("wet", "gz"), ("wet", "gz-members"),
              ("wet", "zst"), ("wet", "plain")]
RECORDS = {("warc", "gz"): 8000, ("warc", "zst"): 8000, ("wet", "gz"): 8000}  # others: 300


def reasons(path, **cfg) -> Counter:
    return Counter(r.reason if isinstance(r, BadRecord) else "kept"
                   for _, r in read_records(path, IngestConfig(**cfg)))


@pytest.mark.parametrize("kind,container", CONTAINERS)
def test_every_record_is_counted_once_and_the_one_over_max_page_bytes_quarantined(
        make_ctx, tmp_path, kind, container):
    n = RECORDS.get((kind, container), 300)
    path = tmp_path / f"crawl.{kind}{SUFFIX[container]}"
    path.write_bytes(pack(warc_records(n, kind == "wet", big=40 * MAX_PAGE), container))
    b = run_ingest(make_ctx(force=True), [str(path)], IngestConfig(max_page_bytes=MAX_PAGE))
    stats = json.loads((b.final / "manifest.json").read_text())["stats"]
    assert stats["records_in"] == n == stats["rows_out"] + stats["rows_removed"]
    removed = read_table(b.final / "removed").to_pylist()
    big = [r for r in removed if r["reason"] == "page_too_large"]
    assert len(big) == 1 and f"https://site.example/{n // 2}" in big[0]["text"]
    pages = n if kind == "wet" else len(range(1, n, 3))
    assert stats["rows_out"] == pages - 1  # every page but the big one


@pytest.mark.parametrize("kind,container", [("warc", "gz"), ("warc", "zst"), ("wet", "gz-members")])
def test_a_file_cut_short_keeps_every_record_before_the_cut_and_counts_the_cut_one(
        tmp_path, kind, container):
    # the last record is incompressible, so that the cut falls inside it
    last = warc_record("metadata", "https://site.example/last", random.Random(0).randbytes(4000))
    path = tmp_path / f"cut.{kind}{SUFFIX[container]}"
    path.write_bytes(pack([*warc_records(60, kind == "wet"), last], container)[:-50])
    got = reasons(path)
    broken = "corrupt_gzip_member" if container.startswith("gz") else "truncated_file"
    assert got[broken] == 1 and sum(got.values()) == 61
    assert got["kept"] == (60 if kind == "wet" else 20)  # pages: records 1, 4, … 58


def test_a_zstd_file_cut_inside_its_only_block_is_one_quarantined_row_not_refused(tmp_path):
    path = tmp_path / "tiny.warc.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"".join(warc_records(50, False)))[:-50])
    assert reasons(path) == {"truncated_file": 1}


# the peak resident memory of reading each file, from a baseline taken after a first read has
# loaded what reading imports; Linux's per-process peak (VmHWM), reset by clear_refs, since
# getrusage's peak starts at the parent's
MEASURE = r"""
import json, re, sys
from collections import Counter
from pathlib import Path
from llmkit.data.ingest import IngestConfig
from llmkit.data.io import BadRecord
from llmkit.data.readers import read_records

def kib(key):
    return int(re.search(key + r":\s+(\d+) kB", Path("/proc/self/status").read_text())[1])

def read(path):
    cfg = IngestConfig(max_page_bytes=int(sys.argv[1]))
    return Counter(r.reason if isinstance(r, BadRecord) else "kept"
                   for _, r in read_records(Path(path), cfg))

read(sys.argv[2])
grown, got = {}, {}
for path in sys.argv[3:]:
    base = kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
    got[path] = read(path)
    grown[path] = kib("VmHWM") - base
print(json.dumps({"grown_kib": grown, "reasons": got}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's peak memory")
def test_a_record_many_times_max_page_bytes_is_skipped_in_bounded_memory(tmp_path):
    big, limit = 48 << 20, 256 << 10
    small = tmp_path / "small.warc.gz"
    small.write_bytes(pack(warc_records(3, False) + warc_records(3, True), "gz"))
    paths = {}
    for kind, container in CONTAINERS:
        path = tmp_path / f"big-{container}.{kind}{SUFFIX[container]}"
        path.write_bytes(pack(warc_records(3, kind == "wet", big=big), container))
        paths[str(path)] = {"page_too_large": 1, **({"kept": 2} if kind == "wet" else {}),
                            **({} if kind == "wet" else {"warc_request": 1, "warc_metadata": 1})}
    out = subprocess.run([sys.executable, "-c", MEASURE, str(limit), str(small), *paths],
                         capture_output=True, text=True, check=True).stdout
    measured = json.loads(out)
    assert measured["reasons"] == paths
    grown_mib = {Path(p).name: kib >> 10 for p, kib in measured["grown_kib"].items()}
    assert max(grown_mib.values()) < 16, f"peak memory grew (MiB): {grown_mib}"
