"""A page's main text is extracted in a child process that `extract_timeout_s` stops even inside
resiliparse's C calls, and a page nested deeper than `max_nesting_depth` is refused as soon as it
is parsed: a hostile page costs seconds, not minutes, and ordinary pages are kept."""

import time

import pytest

from llmkit.data import html_extract
from llmkit.data.ingest import IngestConfig
from llmkit.data.readers import read_records
from llmkit.errors import ConfigError
from tests.data.test_web import EN_ARTICLE, Warc, ingest, page


def read_pages(tmp_path, pages: dict[str, str], **cfg) -> dict:
    """Each page written as NAME.html and read back in order: NAME -> its record."""
    out = {}
    for name, html in pages.items():
        (tmp_path / f"{name}.html").write_text(html)
        [(_, out[name])] = read_records(tmp_path / f"{name}.html", IngestConfig(**cfg))
    return out


def test_a_deeply_nested_page_is_quarantined_within_seconds_and_ordinary_pages_are_kept(
        make_ctx, tmp_path):
    w = Warc()
    w.response("http://ok.example/", page("The lighthouse", EN_ARTICLE).encode(), "text/html")
    # the extractor's time grows ~depth³: this ~100 KB page took it ~25 s, 30,000 levels > 60 s
    w.response("http://deep.example/", ("<html><body>" + "<div>" * 20_000 + EN_ARTICLE).encode(),
               "text/html")
    nested = "<div>" * 200 + f"<p>{EN_ARTICLE}</p>" + "</div>" * 200  # deep, but a page's depth
    w.response("http://nested.example/", f"<html><body>{nested}</body></html>".encode(), "text/html")
    warc = w.save(tmp_path / "nested.warc.gz")
    assert warc.stat().st_size < 3000
    started = time.perf_counter()
    kept, removed, stats = ingest(make_ctx, [warc])
    assert time.perf_counter() - started < 10
    assert [r["url"] for r in kept] == ["http://ok.example/", "http://nested.example/"]
    assert all(EN_ARTICLE in r["text"] for r in kept)
    assert stats["removed_by_reason"] == {"nesting_too_deep": 1}
    assert removed[0]["text"].startswith("response http://deep.example/")


def test_max_nesting_depth_sets_the_limit(tmp_path):
    nested = "<html><body>" + "<div>" * 50 + f"<p>{EN_ARTICLE}</p>" + "</div>" * 50
    assert read_pages(tmp_path, {"p": nested}, max_nesting_depth=60)["p"]["text"] == EN_ARTICLE
    refused = read_pages(tmp_path, {"p": nested}, max_nesting_depth=40)["p"]
    assert (refused.reason, refused.detail) == ("nesting_too_deep", "elements nest deeper than "
                                                                    "max_nesting_depth=40")
    with pytest.raises(ConfigError, match="max_nesting_depth"):
        IngestConfig(max_nesting_depth=0)


def test_a_page_whose_parse_runs_past_the_time_limit_is_stopped_inside_the_c_call(tmp_path):
    # misnested formatting tags: the parser's time grows with their count squared (~15 s here),
    # one C call that the signal timer used before could not interrupt
    slow = "<html><body>" + "<b><i><u>x</b>" * 150_000
    fast = f"<html><body><p>{EN_ARTICLE}</p></body></html>"
    started = time.perf_counter()
    got = read_pages(tmp_path, {"slow": slow, "fast": fast}, extract_timeout_s=0.3)
    assert time.perf_counter() - started < 3
    assert got["slow"].reason == "extraction_timeout"
    assert got["fast"]["text"] == EN_ARTICLE  # read by a new child


def test_a_reader_whose_extracting_process_was_killed_goes_on_with_a_new_one(tmp_path):
    fast = f"<html><body><p>{EN_ARTICLE}</p></body></html>"
    assert read_pages(tmp_path, {"a": fast})["a"]["text"] == EN_ARTICLE
    html_extract._local.child.proc.kill()
    html_extract._local.child.proc.wait()
    assert read_pages(tmp_path, {"b": fast})["b"]["text"] == EN_ARTICLE
