"""WARC and WET files (`.warc`, `.wet`; gzip members, zstd): a document per page.

Read with fastwarc (resiliparse's WARC library, Apache-2.0): a C++ parser several times faster
than warcio, the pure-Python reference (warcio writes the tests' files). A gzipped file is cut
into its gzip members here (zlib, a member at a time) and each member parsed alone, so one
broken record costs only itself: a member that does not decompress (cut short, corrupt) is one
`corrupt_gzip_member` row and reading goes on at the next member; a record whose
Content-Length is too long is `truncated_record`, too short (bytes left over in its member)
`content_length_mismatch`. (A plain or zstd WARC is one stream: after a header it cannot
parse, the rest of the file is one `malformed_warc` row.) Every record counts as read, and is
either a document or a quarantined row with its reason:
- `response` (and `resource`) records holding HTML go through the HTML reader's `page_record`
  (charset, main text, title, the extraction's time limit); other payloads are `not_html`,
  an HTTP status other than 200 is `http_status`, a page over `max_page_bytes` is
  `page_too_large` (its body never kept);
- `conversion` records (WET) are text already: UTF-8, used as they are;
- request, metadata, warcinfo, revisit and continuation records are `warc_<type>`.
Columns: `url`, `domain` (the URL's host), `date` (WARC-Date), `charset` and `title` beside
`text`. The location of a record is `file@offset`, the offset of its WARC header (of its gzip
member in a gzipped file).
"""

from __future__ import annotations

import io
import zlib
from pathlib import Path
from urllib.parse import urlsplit

from llmkit.data.io import BadRecord
from llmkit.data.readers.html import RAW_CHARS, page_record, web_extra
from llmkit.errors import UserError

HTML_TYPES = ("text/html", "application/xhtml+xml")
GZIP_MAGIC = b"\x1f\x8b\x08"  # a gzip member's first bytes (deflate)
CHUNK = 1 << 20
MEMBER_SLACK = 1 << 16  # room for a record's WARC and HTTP headers beside its page


def read_warc(path: Path, cfg):
    web_extra()
    with open(path, "rb") as f:
        gzipped = f.read(2) == GZIP_MAGIC[:2]
    if gzipped:
        yield from _read_members(path, cfg)
    else:
        yield from _read_stream(path, open(path, "rb"), 0, cfg)


def _read_stream(path: Path, stream, base: int, cfg, member: bool = False):
    """The records of a WARC stream; `base` is its offset in the file. In a gzip `member`, a
    parse error after a record means that record's Content-Length lied (bytes were left
    over): the record is quarantined as `content_length_mismatch`."""
    from fastwarc.warc import ArchiveIterator

    n, held = 0, None  # in a member, a record waits until the member is known to end well
    with stream:
        records = iter(ArchiveIterator(stream, parse_http=True, stream_detect=not member))
        while True:
            try:
                record = next(records)
            except StopIteration:
                break
            except OSError as e:  # fastwarc's word for a header it cannot parse
                if n == 0 and base == 0:
                    raise UserError(f"{path}: not a WARC file ({e}); WARC/WET files start "
                                    "with a `WARC/1.x` header, gzipped or not") from None
                if held is not None:
                    held = (held[0], BadRecord("content_length_mismatch", held[2],
                                               f"bytes left after the record: {e}"))
                elif not member:
                    yield f"{path}@end", BadRecord("malformed_warc", "", str(e))
                break
            n += 1
            if held is not None:
                yield held[:2]
            what = f"{record.record_type} {record.headers.get('WARC-Target-URI')}"
            held = (f"{path}@{base + record.stream_pos}", _record(record, cfg), what)
            if not member:
                yield held[:2]
                held = None
    if held is not None:
        yield held[:2]


def _read_members(path: Path, cfg):
    """A gzipped WARC member by member (a record each, as Common Crawl writes them): a member
    that does not decompress (cut short, corrupt) is one `corrupt_gzip_member` record, and
    reading goes on at the next member, so one bad record costs only itself."""
    for offset, data, error in gzip_members(path, cfg.max_page_bytes + MEMBER_SLACK):
        if error is not None:
            yield f"{path}@{offset}", BadRecord("corrupt_gzip_member", "", error)
        elif data.strip(b"\r\n"):
            yield from _read_stream(path, io.BytesIO(data), offset, cfg, member=True)


def gzip_members(path: Path, keep: int):
    """(offset, its first `keep` decompressed bytes, None) for each gzip member of the file, or
    (offset, None, error) for one that cannot be decompressed; after such a one, the next
    member is found by its magic bytes. Memory stays at `keep` plus a chunk."""
    with open(path, "rb") as f:
        buf = f.read(CHUNK)
        while buf:
            start = f.tell() - len(buf)
            member, out, size, error = zlib.decompressobj(31), [], 0, None
            try:
                while True:
                    data = buf
                    while data and not member.eof:  # at most CHUNK out at a time: a page
                        piece = member.decompress(data, CHUNK)  # of one letter inflates
                        if size < keep:                         # a thousandfold
                            out.append(piece[:keep - size])
                        size += len(piece)
                        data = member.unconsumed_tail
                    if member.eof:  # unused_data: what followed the member in its chunk
                        buf = member.unused_data or f.read(CHUNK)
                        break
                    buf = f.read(CHUNK)
                    if not buf:
                        error = "gzip member cut short"
                        break
            except zlib.error as e:
                error = f"gzip: {e}"
            if error is None:
                yield start, b"".join(out), None
                continue
            yield start, None, error
            buf = _next_member(f, start + 1)


def _next_member(f, pos: int) -> bytes:
    """The file from the first gzip magic at or after `pos` (b"" if none), a chunk of it."""
    f.seek(pos)
    while True:
        chunk = f.read(CHUNK)
        if len(chunk) < len(GZIP_MAGIC):
            return b""
        found = chunk.find(GZIP_MAGIC)
        if found >= 0:
            f.seek(pos + found)
            return f.read(CHUNK)
        pos += len(chunk) - len(GZIP_MAGIC) + 1
        f.seek(pos)


def _record(record, cfg) -> dict | BadRecord:
    kind = str(record.record_type)
    url = record.headers.get("WARC-Target-URI")
    what = f"{kind} {url}"
    if kind == "conversion":
        rec = _body(record, what)
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
    if record.content_length > cfg.max_page_bytes:
        return BadRecord("page_too_large", what, f"{record.content_length} bytes > "
                         f"max_page_bytes={cfg.max_page_bytes}")
    body = _body(record, what)
    if isinstance(body, BadRecord):
        return body
    return page_record(body, record.http_charset if http else None, cfg, what)


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
