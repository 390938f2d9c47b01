"""Build the web recipe's crawl offline: one gzipped WARC (a gzip member per record, as Common
Crawl writes them) of real pages installed on this machine, and `sources.tsv` naming the file
and licence behind every record.

- English: the HTML documentation Debian packages install under /usr/share/doc (Node.js,
  valgrind, libxslt, libffi, …), each page once; its licence is the package's copyright file.
- Other languages: Debian has no translated HTML manuals installed here, so the translated
  strings of Debian's message catalogues (zh-Hans, zh-Hant, ja, ko, fr, de, es; and Chinese around
  Python code) from tests/assets/langid_docs.jsonl (built by tests/assets/build_langid_docs.py,
  a source and licence on every row) are laid out as pages of one small site, three documents a
  page, inside that site's navigation and footer.
- The records a crawl also holds: a `warcinfo` record, a `request` before every response, and
  each package's plain-text copyright file as a `text/plain` response.

Record ids and dates are derived from the content, so the same machine builds the same bytes.

    python recipes/web/build_warc.py OUT_DIR
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import os
import sys
import uuid
from pathlib import Path

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

TOP = Path(__file__).resolve().parents[2]
DOC = Path("/usr/share/doc")
CATALOGUE_DOCS = TOP / "tests" / "assets" / "langid_docs.jsonl"
DATE = "2026-12-01T00:00:00Z"
DOCS_PER_PAGE = 3


def debian_pages() -> list[tuple[str, bytes, str, str]]:
    """(url, HTML, source path, licence) of each distinct page under /usr/share/doc (the same
    NEWS.html is installed by several packages: the first by path wins)."""
    seen, pages = set(), []
    for path in sorted(DOC.glob("*/**/*.htm*")):
        body = path.read_bytes() if path.is_file() and path.suffix in (".html", ".htm") else None
        if body is None or body in seen:
            continue
        seen.add(body)
        package, *rel = path.relative_to(DOC).parts
        pages.append((f"https://{package}.docs.debian.invalid/{'/'.join(rel)}", body, str(path),
                      package_licence(package)))
    return pages


def package_licence(package: str) -> str:
    """The first `License:` field of the package's copyright file (that file, named in
    sources.tsv, is the authority: packages combine several licences), else a pointer to it."""
    copyright_file = DOC / package / "copyright"
    if copyright_file.is_file():
        for line in copyright_file.read_text(errors="replace").splitlines():
            if line.startswith("License:") and line[8:].strip():
                return line[8:].strip()
    return f"see {copyright_file}"


def catalogue_pages() -> list[tuple[str, bytes, str, str]]:
    """Translated message-catalogue text laid out as pages of one site, grouped by language."""
    rows = [json.loads(line) for line in CATALOGUE_DOCS.read_text(encoding="utf-8").splitlines()]
    by_lang: dict[str, list[dict]] = {}
    for row in rows:
        by_lang.setdefault(row["lang"], []).append(row)
    pages = []
    for lang, docs in sorted(by_lang.items()):
        for start in range(0, len(docs), DOCS_PER_PAGE):
            group = docs[start:start + DOCS_PER_PAGE]
            url = f"https://l10n.debian.invalid/{lang}/{start // DOCS_PER_PAGE:03d}.html"
            sources = " + ".join(sorted({d["source"] for d in group}))
            licences = " + ".join(sorted({d["licence"] for d in group}))
            pages.append((url, site_page(group[0]["package"], [d["text"] for d in group]).encode(),
                          sources, licences))
    return pages


def site_page(title: str, paragraphs: list[str]) -> str:
    """A page of the translations site: its menu and footer are the same on every page."""
    body = "".join(f"<p>{html.escape(p)}</p>" for p in paragraphs)
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title></head><body>"
            "<nav><a href='/'>Debian translations</a> | <a href='/teams'>Language teams</a> | "
            "<a href='/stats'>Statistics</a></nav>"
            f"<main><h1>{html.escape(title)}</h1>{body}</main>"
            "<footer><p>Translations are maintained by the Debian localisation teams.</p>"
            "<p>Contact: debian-i18n@lists.debian.org</p></footer></body></html>")


def copyright_files() -> list[tuple[str, bytes, str, str]]:
    """Each package's copyright file, served as plain text (a crawl's non-HTML response)."""
    return [(f"https://{p.parent.name}.docs.debian.invalid/copyright", p.read_bytes(), str(p),
             package_licence(p.parent.name))
            for p in sorted(DOC.glob("*/copyright"))
            if p.is_file() and any((p.parent).glob("**/*.htm*"))]


def record_id(*parts: str) -> str:
    return f"<urn:uuid:{uuid.UUID(hashlib.md5('|'.join(parts).encode()).hexdigest())}>"


def write_record(writer: WARCWriter, url: str, kind: str, payload: bytes, **kw) -> None:
    headers = {"WARC-Date": DATE, "WARC-Record-ID": record_id(kind, url)}
    writer.write_record(writer.create_warc_record(url, kind, payload=io.BytesIO(payload),
                                                  warc_headers_dict=headers, **kw))


def write_crawl(out: Path, responses: list[tuple[str, bytes, str, str]]) -> None:
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    info = b"software: recipes/web/build_warc.py\r\nformat: WARC File Format 1.0\r\n"
    write_record(writer, "crawl.warc.gz", "warcinfo", info,
                 warc_content_type="application/warc-fields")
    for url, body, _, ctype in responses:
        host, path = url.split("/", 3)[2:]
        write_record(writer, url, "request", f"GET /{path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode(),
                     warc_content_type="application/http; msgtype=request")
        http = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
        write_record(writer, url, "response", body, http_headers=http)
    # make's target: renamed into place whole, so a killed build leaves no crawl that looks done
    tmp = out / f"crawl.warc.gz.tmp-{os.getpid()}"
    tmp.write_bytes(buf.getvalue())
    tmp.replace(out / "crawl.warc.gz")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    if len(sys.argv) != 2:
        fail(f"usage: {__doc__.rsplit(chr(10) * 2, 1)[1].strip()}")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    html_pages = debian_pages() + catalogue_pages()
    if not any(url.split("/")[2].endswith("docs.debian.invalid") for url, *_ in html_pages):
        fail(f"no HTML documentation under {DOC}; install a package that ships some "
             "(e.g. `apt-get install valgrind libxslt1-dev`) and re-run")
    texts = copyright_files()
    # Debian's pages declare no charset over HTTP (the <meta> or the detector decides); the
    # translations site declares UTF-8, as most servers do
    responses = [(u, b, s, "text/html; charset=utf-8" if u.startswith("https://l10n.") else "text/html")
                 for u, b, s, _ in html_pages]
    responses += [(u, b, s, "text/plain") for u, b, s, _ in texts]
    with open(out / "sources.tsv", "w", encoding="utf-8") as f:
        f.write("url\tsource\tlicence\n")
        for url, _, source, licence in html_pages + texts:
            f.write(f"{url}\t{source}\t{licence}\n")
    write_crawl(out, responses)
    print(f"{out / 'crawl.warc.gz'}: {len(html_pages)} HTML pages, {len(texts)} plain-text "
          f"files, {len(responses)} requests and a warcinfo record; sources in sources.tsv")


if __name__ == "__main__":
    main()
