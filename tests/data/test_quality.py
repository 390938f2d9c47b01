"""`llmkit quality` on a small planted corpus: the classifier ranks unseen spam below unseen
educational text, training is byte-for-byte deterministic, the filter removes exactly what its
settings say with a reason, bad examples are refused or skipped, and a killed run reruns to the
same artifact."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.io import DatasetWriter, dataset_files, read_table
from llmkit.data.quality import QualityConfig, removal_codes, top_share
from llmkit.data.quality_classifier import auc, load_classifier
from llmkit.errors import ConfigError
from llmkit.core.workspace import Workspace
from tests.conftest import write_jsonl
from tests.data.quality_corpus import build, write

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def run(ws: Path, *args: str, code: int = 0):
    r = runner.invoke(build_app(), [*args, "-w", str(ws)])
    assert r.exit_code == code, r.output
    return r


def write_dataset(ws: Path, name: str, rows: list[dict]) -> None:
    b = Workspace(ws).builder(name, stage="ingest", config={}, quiet=True)
    with b:
        w = DatasetWriter(b.dir)
        w.write(pa.Table.from_pylist(rows))
        w.close()


def file_hash(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def all_rows(ws: Path, name: str) -> list[dict]:
    kept = read_table(ws / name).to_pylist()
    return kept + read_table(ws / name / "removed").to_pylist()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The planted corpus, small: files of the train split, rows of the test split."""
    out = tmp_path_factory.mktemp("qcorpus")
    data = build(per_class=320)
    write(out, {"train": data["train"]})
    test = [{**r, "label": 1} for r in data["test"]["good"]] + \
           [{**r, "label": 0} for r in data["test"]["bad"]]
    return {"good": str(out / "good_train.jsonl"), "bad": str(out / "bad_train.jsonl"),
            "test": test}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    """A workspace with the classifier `quality_model` and the held-out rows as `docs`."""
    ws = tmp_path_factory.mktemp("qws") / "ws"
    write_dataset(ws, "docs", [{"id": r["id"], "text": r["text"], "source": r["kind"],
                                "lang": r["lang"], "label": r["label"]} for r in corpus["test"]])
    run(ws, "quality", "--good", corpus["good"], "--bad", corpus["bad"], "--train-only")
    return ws


def test_the_classifier_ranks_unseen_spam_below_unseen_educational_text(trained):
    run(trained, "quality", "--in", "docs", "--out", "scored", "--set", "keep_top=1.0")
    rows = all_rows(trained, "scored")
    for lang in ("en", "zh"):
        mine = [r for r in rows if r["lang"] == lang]
        assert len(mine) > 100
        assert auc(np.array([r["quality"] for r in mine]), np.array([r["label"] for r in mine])) >= 0.95
    held = json.loads((trained / "quality_model/manifest.json").read_text())["stats"]["holdout"]
    assert held["auc"] >= 0.95 and set(held["auc_by_lang"]) == {"en", "zh"}


def test_the_same_seed_gives_the_same_model_bytes_and_another_seed_does_not(trained, corpus):
    first = file_hash(trained / "quality_model/model.bin")
    for name, seed in (("again", 0), ("other_seed", 1)):
        run(trained, "quality", "--good", corpus["good"], "--bad", corpus["bad"], "--model", name,
            "--train-only", "--set", f"seed={seed}")
    assert file_hash(trained / "again/model.bin") == first
    assert file_hash(trained / "other_seed/model.bin") != first
    texts = [r["text"] for r in read_table(trained / "docs").to_pylist()[:50]]
    assert np.array_equal(load_classifier(trained / "quality_model").score(texts),
                          load_classifier(trained / "again").score(texts))


def test_keep_top_keeps_exactly_the_best_share_of_each_group_ties_by_input_order():
    quality = np.array([0.9, 0.1, 0.5, 0.5, 0.7, 0.2, np.nan, 0.5])
    codes = np.array([0, 0, 0, 0, 1, 1, 1, 0])
    # group 0 has five rows: the best 3 are 0.9 and the two first 0.5s; group 1 keeps 1 of 2
    assert top_share(quality, codes, 0.6).tolist() == [True, False, True, True, True, False,
                                                       False, False]
    reasons = removal_codes(quality, codes, QualityConfig(keep_top=0.6))
    assert reasons.tolist() == [0, 2, 0, 0, 0, 2, 3, 2]


def test_a_threshold_removes_rows_below_it_with_their_reason_and_every_column(trained):
    run(trained, "quality", "--in", "docs", "--out", "above", "--set", "min_quality=0.5")
    kept = read_table(trained / "above").to_pylist()
    removed = read_table(trained / "above" / "removed").to_pylist()
    assert kept and removed
    assert all(r["quality"] >= 0.5 for r in kept)
    assert {r["reason"] for r in removed} == {"quality_below_threshold"}
    assert all(r["quality"] < 0.5 for r in removed)
    assert {"id", "text", "source", "lang", "label", "quality"} <= set(kept[0])
    stats = json.loads((trained / "above/manifest.json").read_text())["stats"]
    assert stats["rows_in"] == len(kept) + len(removed) == stats["rows_out"] + stats["rows_removed"]


def test_a_new_keep_top_refilters_without_retraining(trained, corpus):
    before = (trained / "quality_model/manifest.json").read_text()
    r = run(trained, "quality", "--in", "docs", "--out", "half", "--good", corpus["good"],
            "--bad", corpus["bad"], "--set", "keep_top=0.5", "--set", "group_by=lang")
    assert "quality_model: up to date" in r.output
    assert (trained / "quality_model/manifest.json").read_text() == before
    kept = read_table(trained / "half").to_pylist()
    for lang in ("en", "zh"):
        n = sum(r["lang"] == lang for r in all_rows(trained, "half"))
        assert sum(r["lang"] == lang for r in kept) == int(np.floor(0.5 * n + 0.5))


def test_rows_without_text_are_removed_with_a_reason(trained):
    write_dataset(trained, "holes", [{"id": "a", "text": "An ordinary sentence about a module."},
                                     {"id": "b", "text": "   \n "}, {"id": "c", "text": None},
                                     {"id": "d", "text": "BUY NOW!!! cheap loans"}])
    run(trained, "quality", "--in", "holes", "--out", "holes_q", "--set", "keep_top=1.0")
    removed = {r["id"]: r for r in read_table(trained / "holes_q/removed").to_pylist()}
    assert set(removed) == {"b", "c"}
    assert {r["reason"] for r in removed.values()} == {"quality_no_text"}
    assert all(np.isnan(r["quality"]) for r in removed.values())
    assert [r["id"] for r in read_table(trained / "holes_q").to_pylist()] == ["a", "d"]


def test_a_junk_label_exits_2_naming_the_file_row_and_value(tmp_path):
    labels = write_jsonl(tmp_path / "labels.jsonl", [{"text": "good text", "label": "good"},
                                                     {"text": "spam", "label": "maybe"}])
    r = run(tmp_path / "ws", "quality", "--labels", str(labels), "--train-only", code=2)
    assert f"{labels}:2" in r.output and "'maybe'" in r.output and "label_threshold" in r.output
    assert "Traceback" not in r.output


def test_numeric_grades_are_labels_with_a_threshold(tmp_path, corpus):
    rows = [json.loads(line) for line in open(corpus["good"], encoding="utf-8")][:40]
    rows = [{"text": r["text"], "grade": 4} for r in rows] + [
        {"text": json.loads(line)["text"], "grade": 1}
        for line in list(open(corpus["bad"], encoding="utf-8"))[:40]]
    labels = write_jsonl(tmp_path / "graded.jsonl", rows)
    ws = tmp_path / "ws"
    run(ws, "quality", "--labels", str(labels), "--set", "label_column=grade", "--train-only",
        code=2)  # grades without a threshold are not labels
    run(ws, "quality", "--labels", str(labels), "--set", "label_column=grade", "--set",
        "label_threshold=3", "--train-only")
    stats = json.loads((ws / "quality_model/manifest.json").read_text())["stats"]
    assert (stats["good"], stats["bad"]) == (40, 40)


def test_unreadable_and_empty_examples_are_skipped_and_counted(tmp_path, corpus):
    good = tmp_path / "good.jsonl"
    good.write_bytes(Path(corpus["good"]).read_bytes() + b'{"text": "caf\xe9"}\n'
                     + b'{"text": ""}\n' + b'{"text": \n')
    ws = tmp_path / "ws"
    run(ws, "quality", "--good", str(good), "--bad", corpus["bad"], "--train-only")
    stats = json.loads((ws / "quality_model/manifest.json").read_text())["stats"]
    assert stats["skipped_by_reason"] == {"empty_text": 1, "invalid_utf8": 1, "malformed_json": 1}
    assert stats["first_skipped"].startswith(f"{good}:")


@pytest.mark.parametrize("args, words", [
    (["--good", "x.jsonl"], "--good and --bad go together"),
    (["--in", "docs"], "no artifact 'quality_model'"),
    (["--train-only"], "--train-only trains a classifier"),
    (["--good", "missing.jsonl", "--bad", "missing.jsonl", "--train-only"], "no such file"),
])
def test_what_cannot_work_exits_2_with_what_to_do(tmp_path, args, words):
    r = run(tmp_path / "ws", "quality", *args, code=2)
    assert words in r.output


def test_group_by_a_missing_column_exits_2(trained):
    r = run(trained, "quality", "--in", "docs", "--out", "g", "--set", "group_by=domain", code=2)
    assert "group_by='domain'" in r.output


@pytest.mark.parametrize("bad", [dict(keep_top=0), dict(keep_top=1.5), dict(min_quality=2.0),
                                 dict(holdout=1.0)])
def test_bad_settings_are_config_errors(bad):
    with pytest.raises(ConfigError):
        QualityConfig(**bad)


def llmkit_process(ws: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmkit", *args, "-w", str(ws)], cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                          capture_output=True, text=True)


def test_a_run_killed_mid_stage_reruns_to_the_same_artifact(tmp_path, corpus):
    rows = [{"id": r["id"], "text": r["text"], "lang": r["lang"]} for r in corpus["test"][:300]]
    args = ["quality", "--in", "docs", "--good", corpus["good"], "--bad", corpus["bad"],
            "--set", "batch_rows=40", "--set", "group_by=lang"]
    for name in ("calm", "killed"):
        write_dataset(tmp_path / name, "docs", rows)
    assert llmkit_process(tmp_path / "calm", *args).returncode == 0
    for point in ("commit", "quality:batch@3"):  # in the classifier's commit; mid-scoring
        killed = llmkit_process(tmp_path / "killed", *args, env={"LLMKIT_KILL_AT": point})
        assert killed.returncode == -9, killed.stderr
    # three of the eight batches were scored and kept for the rerun
    assert len(list((tmp_path / "killed/.work").glob("quality-*/score/*.batches/*.npy"))) == 3
    done = llmkit_process(tmp_path / "killed", *args)
    assert done.returncode == 0, done.stderr
    for a, b in [("quality_model/model.bin",) * 2] + [
            (p.relative_to(tmp_path / "calm"),) * 2
            for p in dataset_files(tmp_path / "calm/quality")
            + dataset_files(tmp_path / "calm/quality/removed")]:
        assert file_hash(tmp_path / "calm" / a) == file_hash(tmp_path / "killed" / b), a


def test_the_hidden_state_head_trains_deterministically_and_scores(tmp_path, corpus, tok):
    from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run

    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "lm", tiny_model(tok.vocab_size), tok)
    write_dataset(ws, "docs", [{"id": r["id"], "text": r["text"]} for r in corpus["test"][:60]])
    common = ["--set", "backend=hidden", "--encoder", "lm", "--set", "hidden.max_tokens=32",
              "--good", corpus["good"], "--bad", corpus["bad"]]
    run(ws, "quality", *common, "--in", "docs", "--set", "keep_top=0.5")
    run(ws, "quality", *common, "--model", "again", "--train-only")
    assert file_hash(ws / "quality_model/head.safetensors") == file_hash(ws / "again/head.safetensors")
    kept = read_table(ws / "quality").to_pylist()
    assert len(kept) == 30 and all(0 <= r["quality"] <= 1 for r in kept)
    info = json.loads((ws / "quality_model/classifier.json").read_text())
    assert info["encoder"]["step"] == "step-00000001"
