"""The journal keeps what was appended, once, and survives a write cut short."""

from llmkit.judge.journal import Journal, judgement_id, read_journal


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
