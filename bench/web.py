"""Benchmark: web pages in — `llmkit ingest` of a WARC against datatrove's `WarcReader` +
`Trafilatura` + `JsonlWriter` on the same WARC; whole commands, CPU seconds (user + system of
the command and every process it starts), one worker each, three runs.

The WARC (gzip member per record, as Common Crawl writes them) holds the distinct HTML pages
Debian installs under /usr/share/doc (manuals of Node.js, valgrind, libxslt, …) and the known
articles of bench/extract.py (the demo corpus' Chinese prose and English docstrings inside
navigation, cookie banner, sidebar and footer), each page once as UTF-8, the Chinese ones
also as GBK. llmkit's ingest also identifies every page's language (py3langid), which
datatrove's pipeline here does not: its LanguageFilter needs a fastText model downloaded
from the Hub, and this machine has no network. What language ID costs in llmkit's ingest is
measured apart: `language_columns` over the ingested texts, in this process, against the
whole ingest.

    python bench/web.py [--pages 1500] [--runs 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # not bench/, whose tokenize.py would shadow the standard library's

from bench.extract import articles, doc_pages, wrap  # noqa: E402

DATATROVE = """
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.extractors import Trafilatura
from datatrove.pipeline.readers import WarcReader
from datatrove.pipeline.writers import JsonlWriter
folder, out = sys.argv[1], sys.argv[2]
LocalPipelineExecutor(pipeline=[WarcReader(folder, glob_pattern="*.warc.gz"),
                                Trafilatura(favour_precision=True, timeout=10),
                                JsonlWriter(out + "/output")],
                      tasks=1, workers=1, logging_dir=out + "/logs").run()
"""


def build_warc(path: Path, n_pages: int) -> tuple[int, float]:
    """(records, MB of HTML) written to `path`."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    bodies = [(f"https://docs.example/{i}", html.encode("utf-8", "replace"), "utf-8")
              for i, (_, html) in enumerate(doc_pages(n_pages))]
    for i, (lang, title, article) in enumerate(articles(120)):
        page = wrap(title, article)
        bodies.append((f"https://news.example/{lang}/{i}", page.encode(), "utf-8"))
        if lang == "zh":
            gbk = page.replace("charset='utf-8'", "charset='gbk'")
            bodies.append((f"https://news.example/gbk/{i}",
                           gbk.encode("gbk", "xmlcharrefreplace"), "gbk"))
    with open(path, "wb") as f:
        writer = WARCWriter(f, gzip=True)
        for url, body, charset in bodies:
            http = StatusAndHeaders("200 OK", [("Content-Type", f"text/html; charset={charset}")],
                                    protocol="HTTP/1.1")
            writer.write_record(writer.create_warc_record(url, "response",
                                                          payload=io.BytesIO(body),
                                                          http_headers=http))
    return len(bodies), sum(len(b) for _, b, _ in bodies) / 2**20


def cpu_seconds(cmd: list[str]) -> float:
    """User + system CPU of `cmd` and its children, run to the end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def llmkit_ingest(folder: Path, work: Path) -> float:
    shutil.rmtree(work / "ws", ignore_errors=True)
    return cpu_seconds([sys.executable, "-c", "from llmkit.cli.app import main; main()",
                        "ingest", str(folder), "-w", str(work / "ws")])


def datatrove_pipeline(folder: Path, work: Path) -> float:
    shutil.rmtree(work / "dt", ignore_errors=True)
    return cpu_seconds([sys.executable, "-c", DATATROVE, str(folder), str(work / "dt")])


def language_id_share(work: Path) -> tuple[float, int]:
    """(CPU seconds of `language_columns` over the ingested texts, their number)."""
    from llmkit.data.io import read_table
    from llmkit.data.langid import language_columns

    texts = read_table(work / "ws" / "raw").column("text").to_pylist()
    language_columns(texts[0])  # the model loads outside the clock
    start = time.process_time()
    for text in texts:
        language_columns(text)
    return time.process_time() - start, len(texts)


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=1500, help="real HTML pages from /usr/share/doc")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                    help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    args = ap.parse_args()
    if args.quick:
        args.pages, args.runs = 60, 1
    work = Path(tempfile.mkdtemp(prefix="bench-web-"))
    folder = work / "crawl"
    folder.mkdir()
    records, mb = build_warc(folder / "crawl.warc.gz", args.pages)
    print(f"WARC: {records} pages, {mb:.1f} MB of HTML; load: {os.getloadavg()[0]:.1f}")
    results = {"llmkit": [], "datatrove": []}
    for _ in range(args.runs):
        results["llmkit"].append(llmkit_ingest(folder, work))
        results["datatrove"].append(datatrove_pipeline(folder, work))
    kept = json.loads((work / "ws" / "raw" / "manifest.json").read_text())["stats"]["rows_out"]
    dt_docs = sum(1 for f in (work / "dt" / "output").glob("*.jsonl*")
                  for _ in __import__("gzip").open(f, "rt"))
    lang_secs, n = language_id_share(work)
    llm, dt = statistics.median(results["llmkit"]), statistics.median(results["datatrove"])
    print(f"llmkit ingest (resiliparse + py3langid): {spread(results['llmkit'])}; {kept} documents")
    print(f"datatrove WarcReader + Trafilatura:      {spread(results['datatrove'])}; {dt_docs} documents")
    print(f"llmkit is {dt / llm:.1f}x faster (median CPU seconds)")
    print(f"language ID: {lang_secs:.2f} CPU-s for {n} documents = "
          f"{100 * lang_secs / (llm - lang_secs):.0f}% on top of ingest without it")
    print(f"load after: {os.getloadavg()[0]:.1f}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
