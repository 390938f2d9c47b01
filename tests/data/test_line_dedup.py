"""Cross-document line dedup in `llmkit clean`: a line found in many documents is cut from all of
them, a line found in few is kept, a document left empty is removed with its reason, and rows
are conserved — the same for any number of workers."""

import json
import random

import pytest

from llmkit.data.clean import CleanConfig
from llmkit.data.clean_stage import run_clean
from llmkit.data.ingest import IngestConfig, run_ingest
from llmkit.data.io import read_table
from llmkit.core.executor import RunsOn
from llmkit.data.line_dedup import count_line_keys, drop_frequent_lines, line_key
from llmkit.data.rules import RULE_NAMES
from llmkit.errors import ConfigError
from tests.conftest import write_jsonl

FOOTER = "Follow the Riverside Gazette for more stories like this one"
TWICE = "The harbour master kept a second ledger that nobody else was allowed to read."
WORDS = ("river bridge lantern orchard valley meadow harbour signal winter market garden "
         "letter window candle engine pepper silver cotton marble ladder rocket violin").split()


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "."


def corpus(n: int = 10_000, seed: int = 0) -> tuple[list[dict], set[str]]:
    """(rows, ids with the footer): the footer in 30% of the documents (digits in it vary
    and case too: the key folds them), TWICE in two, one document that is only the footer."""
    rng = random.Random(seed)
    rows, footed = [], set()
    for i in range(n):
        lines = [sentence(rng) for _ in range(3)]
        if i % 10 < 3:
            lines.append(f"{FOOTER.upper() if i % 7 == 0 else FOOTER} (page {i % 97})")
            footed.add(f"d{i}")
        if i in (5, 6000):
            lines.insert(1, TWICE)
        rows.append({"id": f"d{i}", "text": "\n".join(lines)})
    rows.append({"id": "only-footer", "text": f"{FOOTER} (page 1)"})
    return rows, footed


def clean_corpus(make_ctx, tmp_path, rows, workers=1, out="clean"):
    src = write_jsonl(tmp_path / "docs.jsonl", rows)
    run_ingest(make_ctx(force=True), [str(src)], IngestConfig(task_bytes=200_000))
    cfg = CleanConfig(line_dedup_min_docs=10, disabled_rules=list(RULE_NAMES),
                      run=RunsOn(workers=workers))
    b = run_clean(make_ctx(out=out), cfg)
    stats = json.loads((b.final / "manifest.json").read_text())["stats"]
    return read_table(b.final), read_table(b.final / "removed"), stats


def test_a_footer_in_30_percent_of_10k_documents_is_cut_from_all_and_a_line_twice_stays(
        make_ctx, tmp_path):
    rows, footed = corpus()
    kept, removed, stats = clean_corpus(make_ctx, tmp_path, rows)
    assert stats["rows_in"] == len(rows) == stats["rows_out"] + stats["rows_removed"]
    assert removed.column("id").to_pylist() == ["only-footer"]
    assert removed.column("reason").to_pylist() == ["line_dedup"]
    texts = dict(zip(kept.column("id").to_pylist(), kept.column("text").to_pylist()))
    assert not [i for i, t in texts.items() if FOOTER.lower() in t.lower()]
    assert TWICE in texts["d5"] and TWICE in texts["d6000"]
    original = {r["id"]: r["text"] for r in rows}
    assert all(texts[i] == original[i].rsplit("\n", 1)[0] for i in footed)
    assert all(texts[i] == original[i] for i in texts if i not in footed)
    assert stats["line_dedup"] == {"frequent_lines": 1, "lines_cut": len(footed)}


@pytest.mark.slow
def test_line_dedup_gives_the_same_artifact_on_one_and_two_workers(make_ctx, tmp_path):
    rows, _ = corpus(n=3000, seed=1)
    one = clean_corpus(make_ctx, tmp_path, rows, workers=1, out="one")
    two = clean_corpus(make_ctx, tmp_path, rows, workers=2, out="two")
    assert one[0].equals(two[0]) and one[1].equals(two[1])


def test_a_line_s_key_folds_case_digits_and_spaces_and_lines_without_letters_are_never_cut():
    assert line_key("  © 2023   Example Media ") == line_key("© 2024 example media")
    assert line_key("}") is None and line_key("----") is None and line_key("") is None
    keys, counts = count_line_keys(["a line\na line\n}", "A LINE", "other"])
    assert dict(zip(keys.tolist(), counts.tolist()))[line_key("a line")] == 2  # once a document
    text = "keep me\n}\nfooter 1\n\n\n}"
    assert drop_frequent_lines(text, frozenset({line_key("footer 9")})) == ("keep me\n}\n\n}", 1)


def test_a_threshold_of_one_document_is_refused():
    with pytest.raises(ConfigError, match="line_dedup_min_docs must be 0 .* or ≥ 2"):
        CleanConfig(line_dedup_min_docs=1)
