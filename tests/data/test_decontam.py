"""`llmkit decontaminate`: evaluation items planted in 10k documents are found (and only they),
in English and Chinese; excision; the stage's artifact, hostile evaluation files, kill -9."""

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.decontam import DecontamConfig, decontaminate_batch, excised_pieces
from llmkit.data.decontam_index import index_for, tokenize
from tests.conftest import write_jsonl
from tests.data.decontam_corpus import EVAL_DATA, EVAL_FILES, planted_corpus

MMLU, CEVAL = EVAL_DATA / "mmlu_en_test.jsonl", EVAL_DATA / "ceval_zh_test.jsonl"
GEN_ZH = EVAL_DATA / "generation_zh.jsonl"
ITEM = "Which built-in function returns the number of items in a container? len"  # mmlu row 2


def llmkit(*args):
    return CliRunner().invoke(build_app(), [str(a) for a in args])


def run(rows, mode="remove", files=EVAL_FILES, **settings):
    cfg = DecontamConfig(against=[str(f) for f in files], mode=mode, **settings)
    return decontaminate_batch(pa.Table.from_pylist(rows), cfg)


def test_planted_items_are_found_and_nothing_else():
    rows, planted = planted_corpus(clean_docs=10_000, per_kind=50)
    kept, removed = run(rows)
    found = dict(zip(removed.column("id").to_pylist(), removed.column("contaminated_by").to_pylist()))
    recall = Counter(kind for doc, (kind, _) in planted.items() if doc in found)
    print(f"recall: verbatim {recall['verbatim']}/50, disguised {recall['disguised']}/50, "
          f"20% words edited {recall['edited']}/50")
    assert recall["verbatim"] == 50 and recall["disguised"] >= 49
    assert not [doc for doc in found if doc.startswith("clean")]  # no removal among 10k clean
    assert all(found[doc] == label for doc, (_, label) in planted.items() if doc in found)
    assert set(removed.column("reason").to_pylist()) == {"contaminated"}
    assert kept.num_rows + removed.num_rows == len(rows)
    langs = {("zh" if "ceval" in label or "_zh" in label else "en")
             for doc, (kind, label) in planted.items() if kind == "verbatim"}
    assert langs == {"en", "zh"}


def test_folding_makes_full_width_case_punctuation_and_spacing_equal():
    plain = tokenize(["Hello, world! 床前明月光，疑是地上霜。 café"])
    dressed = tokenize(["ＨＥＬＬＯ ...world?? 床 前\u3000明月光，，疑是地上霜 — CAFE\u0301"])
    assert plain.hashes.tolist() == dressed.hashes.tolist()
    assert plain.unsegmented.tolist() == [0, 0] + [1] * 10 + [0]  # Chinese by character


def test_a_short_question_alone_is_not_an_item_but_with_its_answer_it_is():
    kept, removed = run([{"id": "q", "text": "《登鹳雀楼》的作者是谁，大家都知道。"},
                         {"id": "qa", "text": "问：《登鹳雀楼》的作者是？王之涣。"}], files=[CEVAL])
    assert removed.column("id").to_pylist() == ["qa"]
    assert removed.column("contaminated_by").to_pylist() == ["ceval_zh_test.jsonl:5"]


def test_excise_cuts_the_match_out_with_margins_and_keeps_the_rest():
    before, after = "Intro words here. " * 30, " closing words follow." * 30
    rows = [{"id": "long", "text": before + ITEM + after}, {"id": "clean", "text": "nothing"},
            {"id": "all", "text": ITEM}]
    kept, removed = run(rows, mode="excise", files=[MMLU], excise_chars=50, min_piece_chars=100)
    texts = dict(zip(kept.column("id").to_pylist(), kept.column("text").to_pylist()))
    assert "len" not in texts["long"] and "container" not in texts["long"]
    assert texts["long"] == before[:-50].strip() + "\n\n" + after[50:].strip()
    assert texts["clean"] == "nothing"
    assert kept.column("contaminated_by").to_pylist() == ["mmlu_en_test.jsonl:2", None]
    assert removed.column("reason").to_pylist() == ["contaminated_nothing_left"]


def test_excise_removes_a_document_cut_into_too_many_pieces():
    text = ("filler " * 60 + ITEM + " ") * 4
    spans = index_for(DecontamConfig(against=[str(MMLU)])).find([text], first_only=False)[2]
    cfg = DecontamConfig(against=[str(MMLU)], max_splits=2, excise_chars=0, min_piece_chars=10)
    assert excised_pieces(text, spans, cfg) is None
    assert len(excised_pieces(text, spans, DecontamConfig(excise_chars=0, min_piece_chars=10))) == 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A workspace with a `docs` dataset of 300 documents, 3 of them contaminated."""
    tmp = tmp_path_factory.mktemp("decontam")
    rows = [{"id": f"d{i}", "text": f"Document {i} is about gardens and rivers in spring. " * 8}
            for i in range(300)]
    rows[10]["text"] += ITEM
    rows[20]["text"] = "诗云：床前明月光，疑是地上霜。" + rows[20]["text"]
    rows[30]["text"] = "Ｗｈｉｃｈ BUILT-IN function returns the number of items in a container: LEN."
    write_jsonl(tmp / "docs.jsonl", rows)
    ws = tmp / "ws"
    r = llmkit("ingest", tmp / "docs.jsonl", "-w", ws, "--out", "docs")
    assert r.exit_code == 0, r.output
    return tmp, ws


DECONTAMINATE = ("decontaminate", "--in", "docs", "--against", f"{MMLU},{GEN_ZH}",
                 "--set", "batch_rows=64")


def test_the_stage_removes_with_provenance_and_counts_per_file(corpus):
    tmp, ws = corpus
    r = llmkit(*DECONTAMINATE, "-w", ws)
    assert r.exit_code == 0, r.output
    out = ws / "decontaminated"
    removed = pq.read_table(out / "removed").to_pylist()
    assert {(x["id"], x["contaminated_by"], x["reason"]) for x in removed} == {
        ("d10", "mmlu_en_test.jsonl:2", "contaminated"), ("d30", "mmlu_en_test.jsonl:2", "contaminated"),
        ("d20", "generation_zh.jsonl:1", "contaminated")}
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    assert (stats["rows_in"], stats["rows_out"], stats["rows_removed"]) == (300, 297, 3)
    mmlu, zh = stats["against"]["mmlu_en_test.jsonl"], stats["against"]["generation_zh.jsonl"]
    assert (mmlu["rows_removed"], zh["rows_removed"]) == (2, 1)
    assert mmlu["rows"] == 30 and mmlu["items_indexed"] + mmlu["skipped"]["too short"] == 30
    assert len(mmlu["sha256"]) == 64
    assert "up to date" in llmkit(*DECONTAMINATE, "-w", ws).output


def test_hostile_evaluation_files_are_skipped_with_a_reason_or_refused(corpus):
    tmp, ws = corpus
    odd = write_jsonl(tmp / "odd.jsonl", [
        {"question": "", "choices": ["a", "b"], "answer": 0}, {"prompt": "", "reference": ""},
        {"unrelated": 1}, {"text": "x" * 10_000_001}, {"prompt": ITEM, "reference": "len"}])
    r = llmkit("decontaminate", "--in", "docs", "--against", odd, "--out", "odd", "-w", ws)
    assert r.exit_code == 0, r.output
    info = json.loads((ws / "odd" / "manifest.json").read_text())["stats"]["against"]["odd.jsonl"]
    assert info["skipped"] == {"no text": 3, "longer than max_item_chars": 1}
    assert (info["items_indexed"], info["rows_removed"]) == (1, 2)
    bad = tmp / "bad.jsonl"
    bad.write_bytes(json.dumps({"prompt": ITEM}).encode() + b"\n{\"text\": \"\xff\xfe\"}\n")
    empty = write_jsonl(tmp / "empty.jsonl", [{"prompt": ""}, {"text": "too short"}])
    for spec, message in ((bad, "bad.jsonl:2"), (empty, "nothing to index"),
                          (tmp / "missing.jsonl", "no such file")):
        r = llmkit("decontaminate", "--in", "docs", "--against", spec, "--out", "x", "-w", ws)
        assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output
    assert llmkit("decontaminate", "--in", "docs", "-w", ws).exit_code == 2  # no --against


def _stage(ws: Path, out: str, kill_at: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "LLMKIT_KILL_AT"}
    env["OMP_NUM_THREADS"] = "1"
    if kill_at:
        env["LLMKIT_KILL_AT"] = kill_at
    args = [str(a) for a in (*DECONTAMINATE, "--out", out, "-w", ws)]
    proc = subprocess.run([sys.executable, "-c", "from llmkit.cli.app import main; main()", *args],
                          env=env, capture_output=True, text=True, start_new_session=True)
    assert proc.returncode == (-signal.SIGKILL if kill_at else 0), proc.stderr[-2000:]


def test_a_killed_run_reruns_to_the_same_artifact(corpus):
    tmp, ws = corpus
    _stage(ws, "straight")
    for point in ("map:batch@3", "commit"):
        _stage(ws, "killed", kill_at=point)
    _stage(ws, "killed")
    files = {p.relative_to(ws / "straight"): p.read_bytes() for p in (ws / "straight").rglob("*")
             if p.is_file() and p.name != "manifest.json"}
    assert files == {p.relative_to(ws / "killed"): p.read_bytes() for p in (ws / "killed").rglob("*")
                     if p.is_file() and p.name != "manifest.json"}
    stats = [json.loads((ws / n / "manifest.json").read_text())["stats"] for n in ("straight", "killed")]
    assert stats[0] == stats[1]
