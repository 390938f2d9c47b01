"""Normalisation, boilerplate lines, `clean_batch` and the `clean` stage end to end, on small
fixtures and on the real demo corpus."""

import dataclasses
import gzip
import hashlib
import json
import multiprocessing
import os
import pickle
import random
import unicodedata
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest

from llmkit.data import normalize, rule_state
from llmkit.data.clean import (CleanConfig, clean_batch, clean_text, drop_boilerplate_lines,
                               is_navigation_line)
from llmkit.data.normalize import ALL_STEPS, normalize_text, scan_texts
from llmkit.data.ingest import IngestConfig, run_ingest
from llmkit.data.io import read_table
from llmkit.data.clean_stage import run_clean
from llmkit.errors import UserError
from llmkit.core.executor import RunsOn
from tests.conftest import write_jsonl

REPO = Path(__file__).resolve().parents[2]
RAW = REPO / "recipes" / "demo" / "data" / "raw"
CFG = CleanConfig()
GOOD_EN = (
    "The river town wakes slowly in winter. Before the sun is up, the baker has already lit his "
    "oven, and the smell of bread drifts down to the water where the ferrymen wait. Children "
    "walk to school in pairs, their breath hanging in the cold air, while their parents open "
    "the shutters of small shops that have stood on the same street for a hundred years."
)


def norm(text, **overrides):
    return normalize_text(text, CleanConfig(**overrides))


# ---------------------------------------------------------------- normalisation


def test_zero_width_bom_soft_hyphen_and_bidi_marks_are_removed():
    assert norm("\ufeffzero\u200bwidth\u200c join\u200d\u2060er soft\u00adhyphen \u202ertl") == \
        "zerowidth joiner softhyphen rtl"


def test_control_characters_including_nul_are_removed_and_line_breaks_unified():
    assert norm("a\x00b\x07c\x1b[0md\x7fe") == "abc[0mde"
    assert norm("one\r\ntwo\rthree\u2028four") == "one\ntwo\nthree\nfour"
    assert norm("keep\ttab", normalize_whitespace=False) == "keep\ttab"


def test_html_tags_and_entities():
    page = '<div class="x">\n<p>Fish&nbsp;&amp; chips</p>\n<p>cost &lt;5&gt; &#8364;<br/>\nnow</p>\n</div>'
    assert norm(page) == "Fish & chips\n\ncost <5> €\nnow"
    assert norm("<script>var a = 1;</script>Text<!-- hidden --> <b>bold</b>") == "Text bold"
    # placeholders in docs are not tags; an entity needs its ";" ("&not=2" is a URL query)
    assert norm("call f(<value>) with ?a=1&not=2") == "call f(<value>) with ?a=1&not=2"
    assert norm("<p>x</p>", strip_html=False) == "<p>x</p>"


def test_nfkc_folds_full_width_ascii_but_keeps_chinese_punctuation():
    assert norm("ＡＢＣ１２３ ﬁle ①") == "ABC123 file 1"
    assert norm("你好，世界！真的？（是）：对；好～…") == "你好，世界！真的？（是）：对；好～…"
    assert norm("你好，世界！", keep_cjk_punctuation=False) == "你好,世界!"
    assert norm("全角　空格") == "全角 空格"
    assert norm("ＡＢＣ", nfkc=False) == "ＡＢＣ"


def test_whitespace_runs_trailing_spaces_and_blank_lines():
    text = "  \n a   b \t c   \n\n\n\n    indented code\nend  \n\n"
    assert norm(text) == "a b c\n\n    indented code\nend"


def test_repeated_punctuation_collapses_to_three():
    assert norm("Wow!!!!!! Really?????") == "Wow!!! Really???"
    assert norm("好。。。。。真的！！！！") == "好。。。真的！！！"
    assert norm("Title\n=========\nwait... ok") == "Title\n=========\nwait... ok"
    assert norm("Wow!!!!!!", max_punctuation_run=0) == "Wow!!!!!!"
    assert norm("Wow!!!!!!", max_punctuation_run=1) == "Wow!"


def test_normalisation_is_idempotent_on_the_demo_noise():
    for row in read_jsonl(RAW / "noise.jsonl"):
        once = normalize_text(row["text"], CFG)
        assert normalize_text(once, CFG) == once


# Pieces that each normalisation step acts on, and their neighbours: whitespace at line
# starts and ends, runs of marks, markup, control and invisible characters, characters NFKC
# changes (full-width, ligatures, no-break spaces, combining marks, Hangul jamo) or keeps.
TRICKY = (list(" \t\n\r.!?。！，…~～#|-*•") + ["  ", "\n\n\n", " \n", "\t\n", "...", "!!!!", "。。。。"]
          + list("aAé\u0301\u0308eｅＡ１\xa0\u3000\u200b\ufeff\x00\x07\x0b\x0c\x85\u2028")
          + list("你好世界，！？：；（）～…「」《》") + ["\ue000", "\ue003", "가", "\u1161", "\u11a8", "ﬁ",
                                                "Å", "K", "İ", "Σ", "<p>", "</div>", "<br/>", "&amp;",
                                                "&#8364;", "&nbsp;", "<script>x</script>"])


def tricky_texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(TRICKY) for _ in range(rng.randrange(40))) for _ in range(count)]


@pytest.mark.parametrize("overrides", [{}, {"keep_cjk_punctuation": False}, {"max_punctuation_run": 1},
                                       {"max_punctuation_run": 0, "strip_html": False}])
def test_the_scan_skips_only_steps_that_would_change_nothing(overrides):
    """normalize_text runs a step only where `scan_texts` found work for it; running every
    step regardless (ALL_STEPS) must give the same text."""
    cfg = CleanConfig(**overrides)
    texts = tricky_texts(1500) + [r["text"] for r in read_jsonl(RAW / "noise.jsonl")]
    for text, found in zip(texts, scan_texts(texts, cfg)):
        assert normalize_text(text, cfg, found) == normalize_text(text, cfg, ALL_STEPS), repr(text)


def test_characters_the_scan_calls_nfkc_stable_are_left_alone_by_nfkc():
    stable = normalize._normalisation_classes() & normalize.NOT_NFKC_STABLE == 0
    for code in map(int, stable[:0x30000].nonzero()[0]):
        if not 0xD800 <= code < 0xE000:
            assert unicodedata.normalize("NFKC", chr(code)) == chr(code), hex(code)
    assert not stable[0x30000:].any()
    assert scan_texts(["你好，世界！", "ｅ", "e\u0301", "\xa0", "가"], CFG) == [0] + [normalize.NFKC] * 4


# ---------------------------------------------------------------- boilerplate lines


def test_navigation_lines_are_menus_not_tables_or_grammar():
    assert is_navigation_line("Home | About Us | Products | Contact")
    assert is_navigation_line("分享到：微信 | 微博 | QQ空间 | 豆瓣")
    assert not is_navigation_line("| Name | Value | Notes |")
    assert not is_navigation_line('integer ::= decinteger | bininteger | octinteger')
    assert not is_navigation_line("flags = re.I | re.M | re.S")
    assert not is_navigation_line("x: int | str | None")


def test_boilerplate_lines_go_and_the_text_stays():
    page = ("Home | Blog | Careers | Contact\nA real sentence about rivers.\n"
            "Copyright © 2020 Acme Inc. All rights reserved.\nPlease enable JavaScript to continue.")
    assert drop_boilerplate_lines(page, CFG) == ("A real sentence about rivers.", 3)
    json_doc = "JSON is a subset of JavaScript syntax."
    assert drop_boilerplate_lines(json_doc, CFG) == (json_doc, 0)
    off = CleanConfig(disabled_rules=["boilerplate_lines"])
    assert drop_boilerplate_lines(page, off) == (page, 0)


def test_c4_unterminated_line_filter_is_opt_in():
    text = "A heading\nA sentence.\nA verse line，\nA list item"
    assert drop_boilerplate_lines(text, CFG)[1] == 0
    cfg = CleanConfig(c4_drop_unterminated_lines=True)
    assert drop_boilerplate_lines(text, cfg) == ("A sentence.\nA verse line，", 2)


# ---------------------------------------------------------------- the demo corpus


def read_jsonl(path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def kept_share(rows):
    return sum(clean_text(r["text"], CFG)[1] is None for r in rows) / len(rows)


@pytest.mark.parametrize("name,every,floor", [
    ("zh_poems.jsonl", 1, 0.95), ("zh_prose.jsonl", 3, 0.95), ("en_docstrings.jsonl.gz", 2, 0.85)])
def test_real_text_passes_the_defaults(name, every, floor):
    rows = [r for r in read_jsonl(RAW / name) if r["planted"] == "none"][::every]
    assert kept_share(rows) >= floor


@pytest.fixture(scope="module")
def noise():
    return read_jsonl(RAW / "noise.jsonl")


@pytest.mark.parametrize("planted", ["boilerplate", "gibberish_latin", "gibberish_cjk", "too_short"])
def test_planted_junk_is_all_removed(noise, planted):
    rows = [r for r in noise if r["planted"] == planted]
    assert rows and all(clean_text(r["text"], CFG)[1] is not None for r in rows)


def test_planted_markup_and_control_characters_are_normalised_not_removed(noise):
    rows = [r for r in noise if r["planted"] in ("html_markup", "control_chars")]
    results = [clean_text(r["text"], CFG) for r in rows]
    assert sum(reason is None for _, reason in results) >= 0.8 * len(rows)
    for text, _ in results:
        assert not any(c in text for c in "\x00\x07\x08\x1b\x7f\u200b\u200c\u200d\u00ad\u2060\ufeff\r")
        assert "<p>" not in text and "&quot;" not in text and "&nbsp;" not in text


def test_planted_boilerplate_lines_lose_the_chrome_and_keep_the_text(noise):
    rows = [r for r in noise if r["planted"] == "boilerplate_lines"]
    for r in rows:
        text, reason = clean_text(r["text"], CFG)
        first, *_ = r["text"].split("\n")  # the page's menu bar
        assert first not in text
        assert "版权所有" not in text and "Cookie" not in text and "cookies" not in text
    assert sum(clean_text(r["text"], CFG)[1] is None for r in rows) >= 0.9 * len(rows)


# ---------------------------------------------------------------- batches and the stage


def demo_sample() -> list[dict]:
    rows = read_jsonl(RAW / "noise.jsonl")[::4] + read_jsonl(RAW / "zh_poems.jsonl")[:20]
    return rows + read_jsonl(RAW / "en_docstrings.jsonl.gz")[:20]


def test_clean_batch_splits_rows_and_keeps_other_columns():
    table = pa.table({"id": ["a", "b", "c"], "text": ["x", GOOD_EN, "\ufeff" + GOOD_EN],
                      "source": ["s"] * 3, "lang": ["en"] * 3})
    kept, removed = clean_batch(table.to_batches()[0], config=CFG)
    assert kept.column_names == ["id", "text", "source", "lang"]
    assert kept.column("id").to_pylist() == ["b", "c"]
    assert kept.column("text").to_pylist() == [GOOD_EN, GOOD_EN]
    assert removed.column_names == ["id", "text", "source", "lang", "reason"]
    assert removed.column("reason").to_pylist() == ["gopher_min_words"]
    assert removed.column("text").to_pylist() == ["x"]  # removed rows keep the original


def test_clean_batch_output_does_not_depend_on_batch_size():
    rows = demo_sample()
    table = pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows],
                      "source": [r["source"] for r in rows]})
    whole = clean_batch(table, config=CFG)
    for size in (1, 7):
        parts = [clean_batch(b, config=CFG) for b in table.to_batches(max_chunksize=size)]
        assert pa.concat_tables([k for k, _ in parts]).equals(whole[0])
        assert pa.concat_tables([r for _, r in parts]).equals(whole[1])


def test_clean_batch_gives_what_clean_text_gives_row_by_row():
    rows = demo_sample()
    table = pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]})
    kept, removed = clean_batch(table, config=CFG)
    results = {r["id"]: clean_text(r["text"], CFG) for r in rows}
    assert {i: results[i] for i in kept.column("id").to_pylist()} == \
        {i: (t, None) for i, t in zip(kept.column("id").to_pylist(), kept.column("text").to_pylist())}
    assert {i: results[i][1] for i in removed.column("id").to_pylist()} == \
        dict(zip(removed.column("id").to_pylist(), removed.column("reason").to_pylist()))


def test_the_config_pickles_as_its_fields_alone():
    cfg = CleanConfig(stop_words=["the", "of"], disabled_rules=["c4_lorem_ipsum"])
    clean_text(GOOD_EN, cfg)  # the rules have run with it: nothing compiled was left on it
    assert set(vars(cfg)) == {f.name for f in dataclasses.fields(cfg)}
    blob = pickle.dumps(cfg)
    assert b"stop_hashes" not in blob and b"numpy" not in blob
    assert pickle.loads(blob) == cfg


def demo_table(rows: list[dict]) -> pa.Table:
    return pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]})


def test_the_rule_holder_is_built_once_for_many_batches_of_unpickled_configs():
    cfg = CleanConfig(min_words=47, pii=["email"])  # content no other test builds a holder for
    before = rule_state.builds
    for batch in demo_table(demo_sample()).to_batches(max_chunksize=5):
        clean_batch(batch, config=pickle.loads(pickle.dumps(cfg)))  # as a pool worker gets it
    assert rule_state.builds - before == 1
    assert rule_state.rule_state(CleanConfig(min_words=46)) is not rule_state.rule_state(cfg)


def _clean_in_worker(batch, config):
    before = rule_state.builds
    kept, removed = clean_batch(batch, config=config)
    return os.getpid(), rule_state.builds - before, kept, removed


def test_pool_workers_build_the_holder_once_each_and_clean_as_one_process_does():
    cfg = CleanConfig(min_words=45, pii=["email"])  # no holder for it yet in this process
    batches = demo_table(demo_sample()).to_batches(max_chunksize=4)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        results = list(pool.map(_clean_in_worker, batches, [cfg] * len(batches)))
    builds = Counter()
    for pid, built, _, _ in results:
        builds[pid] += built
    assert os.getpid() not in builds and set(builds.values()) == {1}
    kept, removed = clean_batch(pa.Table.from_batches(batches), config=cfg)
    assert pa.concat_tables([r[2] for r in results]).equals(kept)
    assert pa.concat_tables([r[3] for r in results]).equals(removed)


# ---------------------------------------------------------------- the pinned results

PINNED = REPO / "tests" / "assets" / "clean_demo_pinned.json"


def demo_rows() -> list[dict]:
    """Every row of the demo corpus that parses (broken.jsonl's bad lines are ingest's
    business), in file order."""
    rows = []
    for path in sorted(RAW.glob("*.jsonl*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            for line in f:
                try:
                    record = json.loads(line.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    continue
                rows.append({"id": record["id"], "text": record["text"]})
    return rows


def demo_variants(rows: list[dict]) -> list[dict]:
    """Every third demo row cut to its first half of lines, pasted twice, and with its lines
    reversed and the first one again: texts near the rules' thresholds, from either side."""
    out = []
    for r in rows[::3]:
        lines = r["text"].split("\n")
        out += [{"id": r["id"] + "#half", "text": "\n".join(lines[:len(lines) // 2 + 1])},
                {"id": r["id"] + "#twice", "text": r["text"] + "\n\n" + r["text"]},
                {"id": r["id"] + "#lines", "text": "\n".join(lines[::-1] + lines[:1])}]
    return out


def cleaned(rows: list[dict], cfg: CleanConfig) -> dict:
    """What `clean_batch` makes of `rows` (batches of 512) as the pinned file holds it: the
    rows removed (id -> reason), counted by reason and as a digest, and a digest of the kept
    rows' ids and normalised texts."""
    table = pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]})
    removed, kept_digest = {}, hashlib.sha256()
    for batch in table.to_batches(max_chunksize=512):
        kept, gone = clean_batch(batch, config=cfg)
        removed.update(zip(gone.column("id").to_pylist(), gone.column("reason").to_pylist()))
        for i, text in zip(kept.column("id").to_pylist(), kept.column("text").to_pylist()):
            kept_digest.update(f"{i}\0{text}\0".encode())
    by_reason = {}
    for reason in removed.values():
        by_reason[reason] = by_reason.get(reason, 0) + 1
    return {"rows": len(rows), "removed_by_reason": dict(sorted(by_reason.items())),
            "removed_sha256": hashlib.sha256(json.dumps(removed).encode()).hexdigest(),
            "kept_sha256": kept_digest.hexdigest(), "removed": removed}


def pinned_corpora() -> dict:
    """name -> (rows, config, whether the file lists the removed rows or only their digest)."""
    rows = demo_rows()
    chinese = [r for r in rows if r["id"].startswith(("zh-", "noise-"))]
    return {"demo": (rows, CFG, True), "variants": (demo_variants(rows), CFG, False),
            "chinese_jieba": (chinese[::10], CleanConfig(cjk_words="jieba"), False)}


def test_the_demo_corpus_loses_exactly_the_pinned_rows_with_the_pinned_reasons():
    """Which rows `clean` removes, why, and the normalised text of the others, on the demo
    corpus and on variants of it, as recorded before the rules were made faster: a speed-up
    must not change them. When a change to the rules is meant to, regenerate the file and
    commit it with the change that explains it:
        LLMKIT_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/data/test_clean.py -k pinned
    """
    corpora = pinned_corpora()
    results = {name: cleaned(rows, cfg) for name, (rows, cfg, _) in corpora.items()}
    if os.environ.get("LLMKIT_REGENERATE_GOLDEN"):
        for name, (_, _, listed) in corpora.items():
            if not listed:
                del results[name]["removed"]
        PINNED.write_text(json.dumps({
            "about": "tests/data/test_clean.py::test_the_demo_corpus_loses_exactly_the_pinned_rows_"
                     "with_the_pinned_reasons", **results}, indent=0, ensure_ascii=False) + "\n",
            encoding="utf-8")
    pinned = json.loads(PINNED.read_text(encoding="utf-8"))
    for name, got in results.items():
        want = pinned[name]
        assert got["rows"] == want["rows"], f"{name}: the corpus changed"
        if "removed" in want:
            changed = {i: (want["removed"].get(i), got["removed"].get(i))
                       for i in want["removed"].keys() | got["removed"].keys()
                       if want["removed"].get(i) != got["removed"].get(i)}
            assert not changed, f"{name}: id -> (pinned reason, reason now): {dict(sorted(changed.items())[:20])}"
        assert got["removed_by_reason"] == want["removed_by_reason"], name
        assert got["removed_sha256"] == want["removed_sha256"], f"{name}: other rows removed"
        assert got["kept_sha256"] == want["kept_sha256"], f"{name}: a kept row's text changed"


@pytest.mark.slow
def test_clean_stage_conserves_rows_counts_reasons_and_matches_across_workers(make_ctx, tmp_path):
    rows = demo_sample()
    src = write_jsonl(tmp_path / "docs.jsonl", rows)
    run_ingest(make_ctx(force=True), [str(src)], IngestConfig())
    expected = {}
    for r in rows:
        reason = clean_text(r["text"], CFG)[1]
        if reason:
            expected[reason] = expected.get(reason, 0) + 1

    outputs = []
    for workers in (1, 2):
        ctx = make_ctx(out=f"clean{workers}")
        b = run_clean(ctx, dataclasses.replace(CFG, run=RunsOn(workers=workers)))
        stats = json.loads((b.final / "manifest.json").read_text())["stats"]
        assert stats["rows_in"] == len(rows) == stats["rows_out"] + stats["rows_removed"]
        assert stats["removed_by_reason"] == dict(sorted(expected.items()))
        outputs.append((read_table(b.final), read_table(b.final / "removed")))
    assert expected["boilerplate_lines"] and expected["gopher_min_words"]
    assert outputs[0][0].equals(outputs[1][0])
    assert outputs[0][1].equals(outputs[1][1])


def test_a_clean_that_keeps_nothing_is_refused_naming_the_rule_unless_allowed(make_ctx, ws,
                                                                             tmp_path):
    src = write_jsonl(tmp_path / "short.jsonl", [{"id": f"s{i}", "text": "too short"}
                                                 for i in range(3)])
    run_ingest(make_ctx(), [str(src)], IngestConfig())

    def clean(cfg):
        return run_clean(make_ctx(), cfg)

    with pytest.raises(UserError, match=r"^clean: no row kept from 3 rows of .*raw: "
                                        r"3 × gopher_min_words \(first: id 's0'\)"):
        clean(CFG)
    assert not (ws / "clean").exists()
    b = clean(CleanConfig(allow_empty=True))
    stats = json.loads((b.final / "manifest.json").read_text())["stats"]
    assert (stats["rows_in"], stats["rows_out"], stats["rows_removed"]) == (3, 0, 3)


def test_recipe_section_and_set_overrides_build_the_config():
    from llmkit.core.config import parse_overrides, resolve_config

    recipe = {"min_words": 20, "max_top_ngram_chars": [0.3, 0.2, 0.1], "cjk_words": "jieba"}
    cfg = resolve_config(CleanConfig, recipe, parse_overrides(
        ["disabled_rules=gopher_stop_words,c4_lorem_ipsum", "max_punctuation_run=2"]))
    assert cfg.min_words == 20 and cfg.cjk_words == "jieba" and cfg.max_punctuation_run == 2
    assert cfg.max_top_ngram_chars == [0.3, 0.2, 0.1]
    assert cfg.disabled_rules == ["gopher_stop_words", "c4_lorem_ipsum"]
    assert clean_text("Lorem ipsum " + GOOD_EN, cfg)[1] is None
