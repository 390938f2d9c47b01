"""WARC and WET files (`.warc`, `.wet`; gzip members, zstd): a document per page.

Read with fastwarc (resiliparse's WARC library, Apache-2.0): a C++ parser that reads
gzip/zstd members itself and is several times faster than warcio, the pure-Python reference
(warcio writes the tests' files). Every record counts as read, and is either a document or a
quarantined row with its reason:
- `response` (and `resource`) records holding HTML go through the HTML reader's `page_record`
  (charset, main text, title); other payloads are `not_html`, an HTTP status other than 200
  is `http_status`, a page over `max_page_bytes` is `page_too_large` (its body never read);
- `conversion` records (WET) are text already: UTF-8, used as they are;
- request, metadata, warcinfo, revisit and continuation records are `warc_<type>`;
- a record whose body ends before its Content-Length is `truncated_record`.
Columns: `url`, `domain` (the URL's host), `date` (WARC-Date), `charset` and `title` beside
`text`. The location of a record is `file@offset`, the offset of its WARC header.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from llmkit.data.io import BadRecord
from llmkit.data.readers.html import RAW_CHARS, page_record, web_extra
from llmkit.errors import UserError

HTML_TYPES = ("text/html", "application/xhtml+xml")


def read_warc(path: Path, cfg):
    web_extra()
    from fastwarc.warc import ArchiveIterator

    n = 0
    with open(path, "rb") as f:
        records = iter(ArchiveIterator(f, parse_http=True, stream_detect=True))
        while True:
            try:
                record = next(records)
            except StopIteration:
                return
            except OSError as e:  # fastwarc's word for a header it cannot parse
                if n == 0:
                    raise UserError(f"{path}: not a WARC file ({e}); WARC/WET files start "
                                    "with a `WARC/1.x` header, gzipped or not") from None
                yield f"{path}@end", BadRecord("malformed_warc", "", str(e))
                return
            n += 1
            yield f"{path}@{record.stream_pos}", _record(record, cfg)


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
