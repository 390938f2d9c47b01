"""Benchmark: main-text extraction for `llmkit ingest` of web pages — resiliparse against
trafilatura, on the same pages, one core, CPU time.

Two sets of pages:
- real HTML: the documentation Debian packages install under /usr/share/doc (Node.js API,
  valgrind, libxslt, …). Speed is pages and MB per CPU-second; the quality spot-check is the
  share of the page's paragraphs (`<p>` of 40+ characters, the body text of a manual) found in
  the extract — a rough recall: some `<p>` are copyright lines and "Next/Previous" links that
  a main-text extractor is right to drop.
- known articles: the demo corpus' Chinese prose and English docstrings (recipes/demo/data/raw,
  licences in recipes/demo), each placed in navigation, a sidebar, a cookie notice and a footer
  with an ICP licence line. Quality is ROUGE-L F1 of the extract against the article (characters
  for Chinese, words for English) and the share of boilerplate snippets kept.

    python bench/extract.py [--pages 120] [--articles 100]
"""

from __future__ import annotations

import argparse
import os
import glob
import gzip
import json
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # not bench/, whose tokenize.py would shadow the standard library's
RAW = ROOT / "recipes" / "demo" / "data" / "raw"

BOILERPLATE = ["首页", "新闻中心", "关于我们", "联系我们", "Home", "Products", "Contact us",
               "Related articles", "Most popular this week",
               "This site uses cookies to improve your experience. Accept all cookies",
               "京ICP备12345678号-1", "Copyright © 2024 Example Media Group. All rights reserved.",
               "Privacy policy", "Terms of use"]


def wrap(title: str, article: str) -> str:
    nav = "".join(f"<li><a href='/{i}'>{w}</a></li>" for i, w in enumerate(BOILERPLATE[:7]))
    paras = "".join(f"<p>{p}</p>" for p in article.split("\n") if p.strip())
    side = "".join(f"<li><a href='/s{i}'>{w}</a></li>" for i, w in enumerate(BOILERPLATE[7:9]))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head>"
            f"<body><header><nav><ul>{nav}</ul></nav></header>"
            f"<div class='cookie-banner'>{BOILERPLATE[9]}</div>"
            f"<main><article><h1>{title}</h1>{paras}</article>"
            f"<aside class='sidebar'><ul>{side}</ul></aside></main>"
            f"<footer><p>{BOILERPLATE[10]}</p><p>{BOILERPLATE[11]}</p>"
            f"<a href='/p'>{BOILERPLATE[12]}</a> <a href='/t'>{BOILERPLATE[13]}</a></footer>"
            "</body></html>")


def articles(n: int) -> list[tuple[str, str, str]]:
    """(lang, title, article) — n Chinese and n English documents of at least 200 characters."""
    out = []
    for lang, path in (("zh", RAW / "zh_prose.jsonl"), ("en", RAW / "en_docstrings.jsonl.gz")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            docs = [json.loads(line)["text"] for line in f]
        docs = [d for d in docs if len(d) >= 200][:n]
        out += [(lang, d.split("\n", 1)[0][:60], d) for d in docs]
    return out


def resiliparse_extract(html: str) -> str:
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse(html)
    return extract_plain_text(tree, main_content=True, list_bullets=False, alt_texts=False)


def trafilatura_extract(html: str) -> str:
    import trafilatura

    return trafilatura.extract(html, include_comments=False) or ""


EXTRACTORS = {"resiliparse": resiliparse_extract, "trafilatura": trafilatura_extract}


def lcs(a: list, b: list) -> int:
    """Length of the longest common subsequence (bit-parallel: one big-int step per item of b)."""
    masks: dict = {}
    for i, x in enumerate(a):
        masks[x] = masks.get(x, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for y in b:
        u = v & masks.get(y, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def units(text: str, lang: str) -> list[str]:
    return re.findall(r"\w", text) if lang == "zh" else re.findall(r"\w+", text.lower())


def rouge_l(extract: str, article: str, lang: str) -> float:
    a, b = units(article, lang), units(extract, lang)
    if not a or not b:
        return 0.0
    n = lcs(a, b)
    p, r = n / len(b), n / len(a)
    return 0.0 if n == 0 else 2 * p * r / (p + r)


def paragraphs(html: str) -> list[str]:
    import lxml.html

    try:
        doc = lxml.html.fromstring(html)
    except Exception:  # lxml refuses a few pages; they have no paragraphs to check then
        return []
    texts = (" ".join(p.text_content().split()) for p in doc.iter("p"))
    return [t for t in texts if len(t) >= 40]


def doc_pages(limit: int) -> list[tuple[str, str]]:
    """Up to `limit` distinct pages (gcc's NEWS.html alone is installed by a dozen packages)."""
    pages: dict[str, tuple[str, str]] = {}
    for p in sorted(glob.glob("/usr/share/doc/**/*.htm*", recursive=True)):
        if Path(p).is_file() and len(pages) < limit:
            html = Path(p).read_bytes().decode("utf-8", errors="replace")
            pages.setdefault(html, (p, html))
    return list(pages.values())


def timed(fn, pages: list[str]) -> tuple[list[str], float]:
    start = time.process_time()
    out = [fn(h) for h in pages]
    return out, time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=150, help="real HTML pages from /usr/share/doc")
    ap.add_argument("--articles", type=int, default=100, help="known articles per language")
    ap.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                    help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    args = ap.parse_args()
    if args.quick:
        args.pages, args.articles = 20, 10
    docs = doc_pages(args.pages)
    if not docs:
        return print("skip: no HTML pages under /usr/share/doc (Debian's documentation packages)")
    known = articles(args.articles)
    wrapped = [wrap(t, a) for _, t, a in known]
    mb = sum(len(h.encode()) for _, h in docs) / 2**20
    print(f"{len(docs)} real pages ({mb:.1f} MB) from /usr/share/doc; {len(known)} known "
          f"articles ({sum(1 for k in known if k[0] == 'zh')} zh) in boilerplate")
    for name, fn in EXTRACTORS.items():
        fn(wrapped[0])  # imports and warm-up outside the clock
        out, secs = timed(fn, [h for _, h in docs])
        found = []
        for (_, html), text in zip(docs, out):
            flat = " ".join(text.split())
            paras = paragraphs(html)
            if paras:
                found.append(sum(p in flat for p in paras) / len(paras))
        known_out, known_secs = timed(fn, wrapped)
        scores = {lang: [rouge_l(t, a, lang) for (l, _, a), t in zip(known, known_out) if l == lang]
                  for lang in ("zh", "en")}
        kept = sum(b in t for t in known_out for b in BOILERPLATE) / (len(BOILERPLATE) * len(known))
        print(f"{name:12s} real: {len(docs) / secs:7.1f} pages/CPU-s {mb / secs:6.2f} MB/CPU-s, "
              f"paragraphs found {statistics.mean(found):.3f} (mean of {len(found)} pages) | "
              f"known: {len(known) / known_secs:7.1f} pages/CPU-s, ROUGE-L zh "
              f"{statistics.mean(scores['zh']):.3f} en {statistics.mean(scores['en']):.3f}, "
              f"boilerplate kept {kept:.3f}")


if __name__ == "__main__":
    main()
