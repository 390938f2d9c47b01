"""The README is a front door, docs/ holds one page per road, and measured runs live in one place.

A measured figure (a rate, a speed-up, the day it was taken) belongs to a dated file under
bench/results/ that states the machine and its load; the README and the docs pages link to it
instead of copying it, so a re-measurement changes one file and no page goes stale.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
RESULTS = REPO / "bench" / "results"
RESULT_FILES = sorted(p for p in RESULTS.glob("*.md") if p.name != "README.md")
PAGES = [README, *DOCS, *RESULTS.glob("*.md")]

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
# 2.15×, 0.26x; 252.2 tokens/s, 14.8 MB/CPU-s, 0.0556 steps/s: what a bench run measures
RATIO = re.compile(r"\b\d+\.\d+[×x](?!\w)")
RATE = re.compile(r"\b\d[\d,.]* ?(?:tokens|steps|docs|pages|[KMG]B|MiB|bytes)/(?:CPU-)?s\b")


def anchors(page: Path) -> set[str]:
    """GitHub's ids of the page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def links(page: Path) -> list[tuple[Path, str]]:
    """(target file, anchor) of every relative link of the page."""
    out = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        out.append(((page.parent / path).resolve() if path else page, anchor))
    return out


def prose(page: Path) -> str:
    """The page's text without link targets (a link may name a dated results file)."""
    return LINK.sub("]", page.read_text())


def test_the_readme_is_a_front_door():
    assert len(README.read_text().splitlines()) <= 400


def test_every_docs_page_is_linked_from_the_readme_and_every_link_holds():
    """Each page is reached from the front door, and no link of the README, the docs or the
    results files points at a file or a heading that is not there (pages move, headings change)."""
    linked = {target for target, _ in links(README)}
    assert DOCS and not [p.name for p in DOCS if p.resolve() not in linked]
    broken = [f"{page.relative_to(REPO)} -> {target.relative_to(REPO)}#{anchor}"
              for page in PAGES for target, anchor in links(page)
              if not target.exists() or anchor and target.suffix == ".md" and anchor not in anchors(target)]
    assert not broken, broken


def test_measured_figures_live_in_bench_results():
    """No date, speed-up or rate in the README or a docs page: they are in a results file."""
    found = {page.name: DATE.findall(prose(page)) + RATIO.findall(prose(page)) + RATE.findall(prose(page))
             for page in [README, *DOCS]}
    assert not any(found.values()), {name: figures for name, figures in found.items() if figures}


def test_every_results_file_is_dated_states_its_machine_and_is_linked():
    linked = {target for page in PAGES for target, _ in links(page)}
    assert RESULT_FILES
    for result in RESULT_FILES:
        assert re.fullmatch(r"20\d\d-\d\d-\d\d-[a-z0-9-]+\.md", result.name), result.name
        assert "**Machine and load:**" in result.read_text(), result.name
        assert result.resolve() in linked, f"{result.name}: no page links to it"


def test_a_figure_with_its_interval_is_in_one_results_file():
    """A median with its spread ("1.77× [1.72–1.83]") is one measurement: one file holds it."""
    seen: dict[str, str] = {}
    assert RESULT_FILES
    for result in RESULT_FILES:
        for figure in set(re.findall(r"\d[\d.,]*×? \[\d[\d.,]*[–-]\d[\d.,]*\]", result.read_text())):
            assert figure not in seen, f"{figure} in {seen.get(figure)} and {result.name}"
            seen[figure] = result.name
