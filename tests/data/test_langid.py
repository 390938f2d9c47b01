"""Language identification on real text — Debian's message catalogues in eight languages and
Chinese around Python code (tests/assets/langid_docs.jsonl, built by
tests/assets/build_langid_docs.py, sources and licences on every row) — with the network shut;
and clean's language rule that reads it."""

import json
import socket
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from llmkit.data import langid
from llmkit.data.clean import CleanConfig, clean_batch
from llmkit.data.rules import RULE_NAMES
from llmkit.errors import ConfigError

DOCS = Path(__file__).resolve().parents[1] / "assets" / "langid_docs.jsonl"
CLASSES = ("zh-Hans", "zh-Hant", "ja", "ko", "en", "fr", "de", "es", "zh-code")


def label(text: str) -> str:
    """zh-Hans / zh-Hant for Chinese, else the model's code."""
    cols = langid.language_columns(text)
    return cols["script"] if cols["lang_id"] == "zh" else cols["lang_id"]


@pytest.fixture
def no_network(monkeypatch):
    """Sockets refused and the model dropped, so it is loaded again without a network."""
    def refused(*args, **kwargs):
        raise OSError("network access in a test")

    monkeypatch.setattr(socket, "socket", refused)
    monkeypatch.setattr(socket, "create_connection", refused)
    monkeypatch.setattr(langid, "_holder", {})


def test_the_fixture_holds_fifty_real_documents_of_each_class_with_their_sources():
    rows = [json.loads(line) for line in DOCS.open(encoding="utf-8")]
    counts = Counter(r["lang"] for r in rows)
    assert set(counts) == set(CLASSES) and min(counts.values()) >= 50
    assert all(r["source"].startswith("/usr/share/locale/") and r["licence"] for r in rows)


def test_language_id_is_97_percent_right_in_all_95_in_each_class_and_keeps_zh_from_ja(no_network):
    rows = [json.loads(line) for line in DOCS.open(encoding="utf-8")]
    wrong, confused = [], 0
    for row in rows:
        want = "zh-Hans" if row["lang"] == "zh-code" else row["lang"]
        got = label(row["text"])
        if got != want:
            wrong.append((row["lang"], got, row["text"][:60]))
        confused += {want.split("-")[0], got.split("-")[0]} == {"zh", "ja"}
    assert 1 - len(wrong) / len(rows) >= 0.97, wrong
    per_class = Counter(lang for lang, _, _ in wrong)
    assert all(n <= 0.05 * 60 for n in per_class.values()), per_class  # each class ≥ 95%
    cjk = sum(r["lang"] in ("zh-Hans", "zh-Hant", "zh-code", "ja") for r in rows)
    assert confused / cjk <= 0.01, wrong


def test_cantonese_and_wu_labels_of_mandarin_are_reported_as_chinese_with_their_summed_score():
    text = "輸出控制： -m, --max-count=NUM 在第 NUM 選取列後停止 -b, --byte-offset 印出每個輸出列的位元組偏移量"
    assert langid.identify(text)[0] == "zh"
    assert langid.language_columns(text)["script"] == "zh-Hant"
    assert 0.9 < langid.identify(text)[1] <= 1.0


def web_rules(**kw) -> CleanConfig:
    """The web rules alone: the quality rules (English stop words…) off."""
    return CleanConfig(disabled_rules=list(RULE_NAMES), **kw)


def rows_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{"id": str(i), "source": "s", **r} for i, r in enumerate(rows)])


GOOD = {"en": "The committee met on Tuesday to discuss the budget for the coming year, and "
              "after a long debate the members agreed to fund the new library, the repairs "
              "to the old bridge and a study of the traffic in the centre of the town.",
        "fr": "Le comité s'est réuni mardi pour discuter du budget de l'année prochaine et, "
              "après un long débat, les membres ont accepté de financer la nouvelle "
              "bibliothèque ainsi que les réparations du vieux pont de la ville.",
        "zh-Hans": "委员会星期二开会讨论了明年的预算。经过长时间的辩论，委员们同意为新图书馆提供资金，"
                   "并修缮老桥，还要研究市中心的交通问题。",
        "zh-Hant": "委員會星期二開會討論了明年的預算。經過長時間的辯論，委員們同意為新圖書館提供資金，"
                   "並修繕老橋，還要研究市中心的交通問題。"}


def test_keep_langs_removes_other_languages_with_the_reason_language():
    table = rows_table([{"text": t} for t in GOOD.values()])
    kept, removed = clean_batch(table, web_rules(keep_langs=["en", "zh-Hant"]))
    assert kept.column("id").to_pylist() == ["0", "3"]
    assert removed.column("reason").to_pylist() == ["language", "language"]
    kept, _ = clean_batch(table, web_rules(keep_langs=["zh"]))
    assert kept.column("id").to_pylist() == ["2", "3"]  # zh keeps both scripts


def test_ingest_s_language_columns_are_used_and_a_low_score_is_removed():
    table = rows_table([
        {"text": GOOD["en"], "lang_id": "fr", "lang_score": 0.99, "script": "latin"},
        {"text": GOOD["fr"], "lang_id": "fr", "lang_score": 0.40, "script": "latin"},
        {"text": GOOD["fr"], "lang_id": "fr", "lang_score": 0.95, "script": "latin"}])
    kept, removed = clean_batch(table, web_rules(keep_langs=["fr"], min_lang_score=0.5))
    assert kept.column("id").to_pylist() == ["0", "2"]  # the column is believed, not re-run
    assert removed.column("reason").to_pylist() == ["language"]


def test_an_unknown_language_code_is_refused_naming_the_closest():
    with pytest.raises(ConfigError, match=r"clean.keep_langs: unknown 'zh-hans'; did you mean "
                                          r"'zh-Hans'\?"):
        CleanConfig(keep_langs=["zh-hans"])
    with pytest.raises(ConfigError, match="min_lang_score"):
        CleanConfig(min_lang_score=1.5)
