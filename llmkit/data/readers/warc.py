"""WARC and WET files (`.warc`, `.wet`; gzipped, zstd): a document per page.

Read with fastwarc (resiliparse's WARC library, Apache-2.0): a Rust parser several times faster
than warcio, the pure-Python reference (warcio writes the tests' files). It parses a stream that
`llmkit.data.compressed_streams` decompresses a piece at a time, so memory stays at a chunk plus
one kept page, whatever a record or a gzip member holds. A gzipped file is read member by member
(one per record, as Common Crawl writes them, or one for the whole file, as `gzip` does): a
broken member costs only itself, reading goes on at the next one. A stream that breaks off (a
gzip member cut short or corrupt, a zstd file cut short) ends in one row naming why,
`corrupt_gzip_member` or `truncated_file`, in place of the record it cut; the records before it
are kept. A record whose Content-Length is too long for its stream is `truncated_record`; too
short (bytes left over in its member) `content_length_mismatch`. After a header it cannot parse,
the rest of a stream is one `malformed_warc` row. Every record counts as read, and is either
a document or a quarantined row with its reason:
- `response` (and `resource`) records holding HTML go through the HTML reader's `page_record`
  (charset, main text, title, the extraction's time limit); other payloads are `not_html`,
  an HTTP status other than 200 is `http_status`;
- `conversion` records (WET) are text already: UTF-8, used as they are;
- a page or text over `max_page_bytes` is `page_too_large`: its body is skipped, never kept;
- request, metadata, warcinfo, revisit and continuation records are `warc_<type>`.
Columns: `url`, `domain` (the URL's host), `date` (WARC-Date), `charset` and `title` beside
`text`. The location of a record is `file@offset`, the offset of its WARC header in the
decompressed stream; in a gzipped file `file@member`, the offset of its gzip member, and
`file@member+offset` for a record after the first in a member.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from llmkit.data.compressed_streams import (GZIP_MAGIC, ZSTD_MAGIC, Decompressed, ZstdStream,
                                            gzip_members)
from llmkit.data.io import BadRecord
from llmkit.data.readers.html import RAW_CHARS, page_record, web_extra
from llmkit.errors import UserError

HTML_TYPES = ("text/html", "application/xhtml+xml")


def read_warc(path: Path, cfg):
    web_extra()
    with open(path, "rb") as f:
        magic = f.read(len(ZSTD_MAGIC))
    if magic.startswith(GZIP_MAGIC[:2]):
        for member in gzip_members(path):
            yield from _read_stream(path, member, cfg, member.offset, "corrupt_gzip_member")
    elif magic == ZSTD_MAGIC:
        yield from _read_stream(path, ZstdStream(path), cfg, None, "truncated_file")
    else:
        yield from _read_stream(path, open(path, "rb"), cfg, None, None)


class _Read(NamedTuple):
    location: str
    rec: dict | BadRecord
    complete: bool  # its stream held all of it
    what: str


def _read_stream(path: Path, stream, cfg, member: int | None, broken: str | None):
    """The records of one stream: a gzip `member` (its offset in the file) or the whole file;
    the last one waits for the stream's end, which decides how the stream ends in `_last`."""
    from fastwarc.warc import ArchiveIterator

    def where(pos: int) -> str:
        return f"{path}@{pos}" if member is None else f"{path}@{member}" + (f"+{pos}" * bool(pos))

    last, failure = None, None
    with stream:
        records = iter(ArchiveIterator(stream, parse_http=True,  # plain: lz4 detected
                                       stream_detect=not isinstance(stream, Decompressed)))
        while True:
            try:
                record = next(records)
            except StopIteration:
                break
            except OSError as e:  # fastwarc's word for a header it cannot parse
                failure = str(e)
                break
            if last is not None:
                yield last[:2]
            last = _Read(where(record.stream_pos), *_read_record(record, cfg), _what(record))
    if failure is not None and last is None and member in (None, 0) and \
            getattr(stream, "error", None) is None:
        raise UserError(f"{path}: not a WARC file ({failure}); WARC/WET files start "
                        "with a `WARC/1.x` header, gzipped or not")
    rest = where(stream.pos) if isinstance(stream, Decompressed) else f"{path}@end"
    yield from _last(last, failure, getattr(stream, "error", None), broken, member, rest)


def _last(last: _Read | None, failure: str | None, error: str | None, broken: str | None,
          member: int | None, rest: str):
    """The rows that end a stream: its last record, then
    - if the stream broke off (`error`), one `broken` row, in place of that record if the
      break cut it short;
    - if a header could not be parsed (`failure`): in a member, that record becomes
      `content_length_mismatch` (its Content-Length left bytes over); elsewhere the rest of the
      stream (from `rest`) is one `malformed_warc` row."""
    if error is not None:
        cut = last is not None and not last.complete
        if last is not None and not cut:
            yield last[:2]
        yield (last.location if cut else rest), BadRecord(broken, last.what if cut else "", error)
    elif failure is not None and member is not None and last is not None:
        yield last.location, BadRecord("content_length_mismatch", last.what,
                                       f"bytes left after the record: {failure}")
    else:
        if last is not None:
            yield last[:2]
        if failure is not None:
            yield rest, BadRecord("malformed_warc", "", failure)


def _read_record(record, cfg) -> tuple[dict | BadRecord, bool]:
    """The record read, and whether its stream held all of it. What `_record` left of its
    body is skipped here, a buffer at a time."""
    length = record.content_length
    if record.headers.get("Content-Length") is None:  # the stream ended inside its header
        return BadRecord("truncated_record", _headers(record, _what(record)),
                         "WARC header without Content-Length"), False
    rec = _record(record, cfg)
    record.consume()
    if record.reader.tell() < length:
        return BadRecord("truncated_record", _what(record),
                         f"{record.reader.tell()} of {length} bytes"), False
    return rec, True


def _what(record) -> str:
    return f"{record.record_type} {record.headers.get('WARC-Target-URI')}"


def _record(record, cfg) -> dict | BadRecord:
    kind = str(record.record_type)
    url = record.headers.get("WARC-Target-URI")
    what = _what(record)
    if kind == "conversion":
        rec = _too_large(record, cfg, what) or _body(record, what)
        if not isinstance(rec, BadRecord):
            text = rec.decode("utf-8", errors="replace")
            rec = {"text": text, "title": None, "charset": "utf-8"} if text.strip() else \
                BadRecord("empty_text", what)
    elif kind in ("response", "resource"):
        rec = _page(record, kind, cfg, what)
    else:
        return BadRecord(f"warc_{kind}", _headers(record, what))
    if isinstance(rec, BadRecord):
        return rec
    return {**rec, "url": url, "domain": _domain(url), "date": record.headers.get("WARC-Date")}


def _page(record, kind: str, cfg, what: str) -> dict | BadRecord:
    http = kind == "response" and record.is_http
    if kind == "response" and not http:
        return BadRecord("not_http", _headers(record, what))
    if http and record.http_headers.status_code != 200:
        return BadRecord("http_status", _headers(record, what),
                         f"HTTP {record.http_headers.status_code}")
    ctype = record.http_content_type if http else \
        (record.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if ctype not in HTML_TYPES:
        return BadRecord("not_html", _headers(record, what), f"Content-Type {ctype!r}")
    body = _too_large(record, cfg, what) or _body(record, what)
    if isinstance(body, BadRecord):
        return body
    return page_record(body, record.http_charset if http else None, cfg, what)


def _too_large(record, cfg, what: str) -> BadRecord | None:
    if record.content_length > cfg.max_page_bytes:  # never read: skipped a buffer at a time
        return BadRecord("page_too_large", what, f"{record.content_length} bytes > "
                         f"max_page_bytes={cfg.max_page_bytes}")
    return None


def _body(record, what: str) -> bytes | BadRecord:
    body = record.reader.read()
    if len(body) < record.content_length:
        return BadRecord("truncated_record", what, f"{len(body)} of {record.content_length} "
                         "bytes")
    return body


def _headers(record, what: str) -> str:
    """A quarantined record as `removed/` shows it: its WARC (and HTTP) headers, no body."""
    lines = [what, *(f"{k}: {v}" for k, v in record.headers)]
    if record.is_http:
        lines += [f"{k}: {v}" for k, v in record.http_headers]
    return "\n".join(lines)[:RAW_CHARS]


def _domain(url: str | None) -> str | None:
    try:
        return urlsplit(url).hostname if url else None
    except ValueError:
        return None
