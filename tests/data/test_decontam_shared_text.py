"""`llmkit decontaminate` removes only documents that contain an evaluation item: a gold choice
alone counts by its full 13-grams, text several items of a file share (an instruction, a
template) is not an item, and on real documents with planted items and quiz pages nothing
clean goes while every planted item is found."""

from collections import Counter

import pyarrow as pa

from llmkit.data.decontam import DecontamConfig, decontaminate_batch
from llmkit.data.decontam_index import index_for
from tests.conftest import write_jsonl
from tests.data.decontam_corpus import (EVAL_FILES, QUIZ, folded_tokens, planted_items,
                                        real_planted_corpus, write_quiz)


def run(rows, files):
    cfg = DecontamConfig(against=[str(f) for f in files])
    kept, removed = decontaminate_batch(pa.Table.from_pylist(rows), cfg)
    return dict(zip(removed.column("id").to_pylist(), removed.column("contaminated_by").to_pylist()))


SENTENCE = "If they are unavailable, using them will raise a NotImplementedError."  # 5 docstrings
QUESTION = "What happens on a platform that lacks the optional scheduling functions?"


def test_a_gold_choice_alone_counts_only_by_its_full_13_grams(tmp_path):
    long_gold = "It raises an error that names the function and the platform it is missing on."
    quiz = write_jsonl(tmp_path / "quiz.jsonl", [
        {"question": QUESTION, "choices": [SENTENCE, "None.", "A warning."], "answer": 0},
        {"question": "Why does the call fail?", "choices": ["No.", long_gold], "answer": 1}])
    removed = run([{"id": "docstring", "text": f"Scheduling functions.\n\n{SENTENCE}"},
                   {"id": "leak", "text": f"Q: {QUESTION}\n{SENTENCE}"},
                   {"id": "long gold", "text": f"Note: {long_gold}"}], [quiz])
    assert removed == {"leak": "quiz.jsonl:1", "long gold": "quiz.jsonl:2"}


INSTRUCTION = ("Read the quiz question below and answer it with the name of one module from "
               "the Python standard library.")  # 19 words: whole 13-grams of it alone
SHORT = "Answer with the name of one module from the standard library:"  # 11 words


def test_text_shared_by_items_of_a_file_is_not_an_item(tmp_path):
    quiz = write_jsonl(tmp_path / "quiz.jsonl", [
        {"prompt": f"{INSTRUCTION} Which module compresses files in the gzip format?", "reference": "gzip"},
        {"prompt": f"{INSTRUCTION} Which module turns Python objects into a byte stream and back "
                   "again for storage on disk?", "reference": "pickle"},
        {"question": f"{SHORT} Which module reads and writes files in the comma separated values "
                     "format?", "choices": ["csv", "json"], "answer": 0},
        {"question": f"{SHORT} Which function returns the length of a sequence?", "choices": ["len"],
         "answer": 0}])
    removed = run([
        {"id": "quiz page", "text": f"{INSTRUCTION} Which module reads JSON? json\n\n{INSTRUCTION} "
                                    "Which module compresses data in the bz2 format? bz2"},
        {"id": "other page", "text": f"{SHORT} Which module reads and writes archives in the zip format?"},
        {"id": "item 2", "text": f"Quiz! {INSTRUCTION} Which module turns Python objects into a "
                                 "byte stream and back again for storage on disk? pickle"},
        {"id": "item 3", "text": "Which module reads and writes files in the comma separated values "
                                 "format? csv"}], [quiz])
    assert removed == {"item 2": "quiz.jsonl:2", "item 3": "quiz.jsonl:3"}


def test_a_repeated_item_is_still_an_item_named_by_its_first_row(tmp_path):
    row = {"question": QUESTION, "choices": [SENTENCE, "None."], "answer": 0}
    quiz = write_jsonl(tmp_path / "quiz.jsonl", [row, {"prompt": "Unrelated.", "reference": "x"}, row])
    assert run([{"id": "leak", "text": f"{QUESTION} {SENTENCE}"}], [quiz]) == {"leak": "quiz.jsonl:1"}
    stats = index_for(DecontamConfig(against=[str(quiz)])).files["quiz.jsonl"]
    assert (stats.items_indexed, stats.skipped) == (2, {"too short": 1})


def test_items_that_only_share_text_are_skipped_with_that_reason(tmp_path):
    quiz = write_jsonl(tmp_path / "quiz.jsonl", [
        {"prompt": f"{INSTRUCTION} Which one?", "reference": "os"},
        {"prompt": f"{INSTRUCTION} Which one?", "reference": "re"},
        {"prompt": QUESTION, "reference": SENTENCE}])
    stats = index_for(DecontamConfig(against=[str(quiz)])).files["quiz.jsonl"]
    assert (stats.items_indexed, stats.skipped) == (1, {"shared with other items": 2})


def contained(text: str, leaks: list) -> set:
    """The items whose leak text (question and gold answer, prompt and reference, a reference of
    8 tokens or more) is a run of the document's folded tokens: ground truth, apart from the index."""
    doc = f" {folded_tokens(text)} "
    return {label for label, leak in leaks if f" {leak} " in doc}


def test_real_documents_lose_only_those_that_contain_an_item(tmp_path):
    quiz = write_quiz(tmp_path)
    rows, planted = real_planted_corpus(quiz)
    leaks = [(f"{name}:{row}", folded_tokens(text))
             for name, row, text in planted_items([*EVAL_FILES, quiz])]
    leaks += [(f"quiz.jsonl:{n}", folded_tokens(r["reference"])) for n, r in enumerate(QUIZ, 1)
              if "reference" in r and len(folded_tokens(r["reference"]).split()) >= 8]
    removed = run(rows, [*EVAL_FILES, quiz])
    truth = {r["id"]: contained(r["text"], leaks) for r in rows}
    wrong = {doc: by for doc, by in removed.items() if by not in truth[doc]}
    missed = {doc: items for doc, items in truth.items() if items and doc not in removed}
    per_kind = Counter(planted.get(doc, ("natural",))[0] for doc in removed)
    print(f"{len(rows)} documents, {len(removed)} removed: {dict(per_kind)}")
    assert not wrong and not missed, (wrong, missed)
    assert per_kind["verbatim"] == per_kind["disguised"] == 25 and per_kind["quiz page"] == 0
    assert all(removed[doc] == label for doc, (_, label) in planted.items() if label)
