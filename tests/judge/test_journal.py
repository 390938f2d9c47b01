"""The journal keeps what was appended, once, survives a write cut short, and has one writer."""

import json
import os

import pytest

from llmkit.errors import UserError
from llmkit.judge.journal import Journal, first_judgements, judgement_id, read_journal, writer_of


def test_a_reopened_journal_drops_a_torn_line_and_appends_on_a_line_of_its_own(tmp_path):
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.append({"rater": "ann", "item": "i1", "choice": "left"})
    journal.close()
    with open(path, "ab") as f:
        f.write(b'{"id": "x", "rater": "ann", "item": "i2", "cho')  # killed mid-write: never confirmed
    assert [r["item"] for r in read_journal(path)] == ["i1"]
    journal = Journal(path)
    assert journal.judged_by("ann") == {"i1"}
    journal.append({"rater": "ann", "item": "i2", "choice": "tie"})
    journal.close()
    assert [(r["item"], r["choice"]) for r in read_journal(path)] == [("i1", "left"), ("i2", "tie")]


def test_the_same_rater_and_item_are_one_judgement(tmp_path):
    journal = Journal(tmp_path / "journal.jsonl")
    first, repeated = journal.append({"rater": "ann", "item": "i1", "choice": "left"})
    again, repeated_again = journal.append({"rater": "ann", "item": "i1", "choice": "right"})
    journal.close()
    assert (repeated, repeated_again) == (False, True) and again == first
    assert first["id"] == judgement_id("ann", "i1") != judgement_id("bob", "i1")
    assert len(read_journal(tmp_path / "journal.jsonl")) == 1
    assert Journal(tmp_path / "journal.jsonl").append({"rater": "ann", "item": "i1", "choice": "tie"})[1]


def test_a_second_writer_is_refused_naming_the_session_and_the_holder_until_the_first_closes(tmp_path):
    path = tmp_path / "journal.jsonl"
    first = Journal(path)
    first.note_holder(url="http://127.0.0.1:9/")
    with pytest.raises(UserError) as refused:
        Journal(path)
    assert str(tmp_path) in str(refused.value) and f"process {os.getpid()}" in str(refused.value)
    assert "http://127.0.0.1:9/" in str(refused.value)
    assert writer_of(path)["pid"] == os.getpid()
    first.close()
    assert writer_of(path) is None
    Journal(path).close()  # free again


def test_a_journal_with_repeats_counts_each_rater_and_item_once_the_first(tmp_path):
    path = tmp_path / "journal.jsonl"
    lines = [{"id": judgement_id("ann", "i1"), "rater": "ann", "item": "i1", "choice": "left"},
             {"id": judgement_id("bob", "i1"), "rater": "bob", "item": "i1", "choice": "tie"},
             {"id": judgement_id("ann", "i1"), "rater": "ann", "item": "i1", "choice": "right"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))  # two servers, before the lock
    first, repeats = first_judgements(read_journal(path))
    assert [(j["rater"], j["choice"]) for j in first] == [("ann", "left"), ("bob", "tie")] and repeats == 1
    journal = Journal(path)
    assert journal.append({"rater": "ann", "item": "i1", "choice": "tie"}) == (lines[0], True)
    journal.close()
