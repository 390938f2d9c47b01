"""recipes/web end to end: a WARC of the real pages installed on this machine, through ingest,
clean's web options and dedup with `make`, and the table of what each step removed agreeing
with the rows each artifact set aside. (Ingest on 1/2 workers and Ray, kill -9 and hostile
records are tests/data/test_web.py's.)"""

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from llmkit.data.io import read_table

TOP = Path(__file__).resolve().parents[2]
BUILD = TOP / "recipes" / "web" / "build_warc.py"
LLMKIT = Path(sys.executable).parent / "llmkit"
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}\b")

needs_pages = pytest.mark.skipif(
    not any(Path("/usr/share/doc").glob("*/**/*.htm*")) or shutil.which("make") is None
    or not LLMKIT.exists(),
    reason="needs Debian's HTML docs under /usr/share/doc, make and the llmkit script")


def make(ws: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(TOP / "recipes" / "web"), f"WS={ws}",
                           f"LLMKIT={LLMKIT}", f"PYTHON={sys.executable}"],
                          capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def table_counts(summary: str) -> dict[str, Counter]:
    """stage -> reason -> rows, as the summary's table states them."""
    counts, stage = {}, None
    for cells in (line.strip("|").split("|") for line in summary.splitlines()
                  if line.startswith("| ") and "`" in line):
        stage = cells[0].strip() or stage
        counts.setdefault(stage, Counter())[cells[2].strip(" `")] = int(cells[3])
    return counts


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    ws = tmp_path_factory.mktemp("web")
    first = make(ws)
    assert first.returncode == 0, first.stdout + first.stderr
    return ws, first, make(ws)


@needs_pages
def test_the_table_states_exactly_the_rows_each_step_set_aside(recipe_run):
    ws, first, _ = recipe_run
    summary = (ws / "web" / "summary.md").read_text()
    assert summary in first.stdout  # printed by the make run
    stated = table_counts(summary)
    for stage, artifact in [("ingest", "raw"), ("clean", "clean"), ("dedup", "dedup")]:
        removed = Counter(read_table(ws / artifact / "removed").column("reason").to_pylist())
        assert stated[stage] == removed, stage
    assert {"warc_request", "warc_warcinfo", "not_html"} <= set(stated["ingest"])
    assert {"language", "url"} <= set(stated["clean"]) and stated["dedup"]["minhash_duplicate"] > 0


@needs_pages
def test_the_web_options_removed_and_redacted_what_the_recipe_asks(recipe_run):
    ws = recipe_run[0]
    kept = read_table(ws / "clean").to_pylist()
    removed = read_table(ws / "clean" / "removed").to_pylist()
    by_language = [r for r in removed if r["reason"] == "language"]
    assert {r["lang_id"] for r in by_language} >= {"fr", "de", "es", "ja", "ko"}
    assert all(r["lang_id"] not in ("en", "zh") or r["lang_score"] < 0.5 for r in by_language)
    assert all(r["lang_id"] in ("en", "zh") and r["lang_score"] >= 0.5 for r in kept)
    assert {r["reason"] for r in removed if "/gtk-doc/" in r["url"]} == {"url"}
    assert not any("/gtk-doc/" in r["url"] for r in kept)
    assert not [m for r in kept for m in EMAIL.findall(r["text"])]  # the docs' authors' addresses
    assert sum("[EMAIL]" in r["text"] for r in kept) > 0
    raw = {r["id"]: r["text"] for r in read_table(ws / "raw").to_pylist()}
    docs_per_line = Counter(line for r in kept for line in {x.strip() for x in raw[r["id"]].splitlines()}
                            if any(ch.isalpha() for ch in line))
    # lines on ≥ 10 kept pages ("Main Menu", "Table of Contents") are past the recipe's 5
    furniture = {line for line, n in docs_per_line.items() if n >= 10}
    assert len(furniture) >= 3
    assert not [line for r in kept for line in r["text"].splitlines() if line.strip() in furniture]


@needs_pages
def test_a_second_make_does_nothing(recipe_run):
    again = recipe_run[2]
    assert again.returncode == 0 and "Nothing to be done" in again.stdout, again.stdout


@needs_pages
def test_the_crawl_is_built_to_the_same_bytes_with_its_sources_recorded(recipe_run, tmp_path):
    ws = recipe_run[0]
    subprocess.run([sys.executable, str(BUILD), str(tmp_path)], check=True, capture_output=True)
    rebuilt = (tmp_path / "crawl.warc.gz").read_bytes()
    assert rebuilt == (ws / "crawl" / "crawl.warc.gz").read_bytes()
    sources = (tmp_path / "sources.tsv").read_text().splitlines()
    urls = {line.split("\t")[0] for line in sources[1:]}
    raw_urls = set(read_table(ws / "raw").column("url").to_pylist())
    assert raw_urls <= urls and all(line.count("\t") == 2 and line.split("\t")[2]
                                    for line in sources[1:])
