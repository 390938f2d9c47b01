import json

import numpy as np
import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.dedup.phases import PHASES
from llmkit.data.dedup.phases.buckets import Buckets
from llmkit.data.dedup.phases.filter import Filter
from llmkit.data.dedup.phases.signatures import Signatures
from llmkit.data.dedup.planted import pair_scores, planted_corpus
from llmkit.data.dedup.stage import DedupConfig, run_dedup
from llmkit.data.io import dataset_files, read_table
from llmkit.errors import UserError
from llmkit.core.executor import RunsOn
from tests.data.dedup.conftest import make_dataset, predicted_clusters


def dedup(make_ctx, cfg=None, **ctx):
    return run_dedup(make_ctx(**ctx), cfg or DedupConfig())


def lookalikes_merged(corpus, labels) -> float:
    kinds, source = np.array(corpus.kinds), np.array(corpus.source_of)
    la = np.flatnonzero(kinds == "lookalike")
    return float(np.mean(labels[la] == labels[source[la]]))


@pytest.mark.parametrize("lang,min_recall", [("en", 0.95), ("zh", 0.90)])
def test_minhash_defaults_find_copies_with_up_to_ten_percent_edits(make_ctx, ws, lang,
                                                                   min_recall):
    corpus = planted_corpus(120, lang=lang, unique=60, edit_rate=(0.03, 0.10), seed=11)
    make_dataset(ws, corpus.texts)
    b = dedup(make_ctx)
    labels = predicted_clusters(b.final, len(corpus))
    precision, recall = pair_scores(corpus.truth, labels)
    assert precision >= 0.98 and recall >= min_recall, (precision, recall)
    assert lookalikes_merged(corpus, labels) <= 0.02
    assert b.stats["lsh_bands"] * b.stats["lsh_rows"] <= DedupConfig().minhash.num_perm


def test_simhash_finds_copies_with_up_to_three_percent_edits(make_ctx, ws):
    corpus = planted_corpus(150, unique=50, exact_copies=0, edit_rate=(0.01, 0.03), seed=12)
    make_dataset(ws, corpus.texts)
    labels = predicted_clusters(dedup(make_ctx, DedupConfig(method="simhash")).final,
                                len(corpus))
    precision, recall = pair_scores(corpus.truth, labels)
    assert precision >= 0.98 and recall >= 0.9, (precision, recall)
    assert lookalikes_merged(corpus, labels) <= 0.02


def test_exact_finds_exactly_the_exact_copies(make_ctx, ws):
    corpus = planted_corpus(100, unique=20, exact_copies=0.5, seed=13)
    make_dataset(ws, corpus.texts)
    labels = predicted_clusters(dedup(make_ctx, DedupConfig(method="exact")).final,
                                len(corpus))
    first_of_text = {}
    for i, text in enumerate(corpus.texts):
        first_of_text.setdefault(text, i)
    assert labels.tolist() == [first_of_text[t] for t in corpus.texts]
    assert corpus.kinds.count("exact") > 20


def test_removed_rows_carry_reason_and_the_kept_id_and_rows_are_conserved(make_ctx, ws):
    corpus = planted_corpus(40, unique=10, seed=14)
    make_dataset(ws, corpus.texts, parts=2)
    b = dedup(make_ctx)
    kept, removed = read_table(b.final), read_table(b.final / "removed")
    assert set(removed.column("reason").to_pylist()) == {"minhash_duplicate"}
    kept_ids = set(kept.column("id").to_pylist())
    for doc, dup in zip(removed.column("id").to_pylist(),
                        removed.column("duplicate_of").to_pylist()):
        assert dup in kept_ids and int(dup[3:]) < int(doc[3:])  # the first one is kept
    assert kept.column_names == ["id", "text", "source", "score"]  # other columns carried
    assert removed.column("score").to_pylist() == [float(d[3:]) for d in
                                                   removed.column("id").to_pylist()]
    stats = json.loads((b.final / "manifest.json").read_text())["stats"]
    assert stats["rows_in"] == len(corpus) == stats["rows_out"] + stats["rows_removed"]
    assert stats["removed_by_reason"] == {"minhash_duplicate": removed.num_rows}
    assert stats["rows_out"] == kept.num_rows and stats["clusters"] > 0
    assert stats["documents_in_clusters"] == stats["clusters"] + stats["rows_removed"]
    assert sum(stats["cluster_sizes"].values()) == stats["clusters"]
    assert not b.work_dir.exists()  # the work area goes once the artifact is committed


def test_three_task_rank_run_equals_the_local_run(make_ctx, ws):
    corpus = planted_corpus(40, unique=10, seed=15)
    make_dataset(ws, corpus.texts, parts=4)
    local = dedup(make_ctx, out="local")
    for phase in ("signatures", "buckets", "clusters", "filter"):
        for rank in range(3):
            assert run_dedup(make_ctx(out="ranked"), DedupConfig(run=RunsOn(rank=rank, world_size=3)),
                             phase=phase) is None
    assert not (ws / "ranked").exists()  # tasks alone never commit
    ranked = dedup(make_ctx, out="ranked")  # finds every task done; only assembles
    for sub in ("", "removed"):
        assert read_table(ranked.final / sub).equals(read_table(local.final / sub))
    assert len(dataset_files(ranked.final)) == len(dataset_files(local.final))
    assert ranked.stats["rows_removed"] == local.stats["rows_removed"] > 0


def test_worker_processes_give_the_same_artifact(make_ctx, ws):
    corpus = planted_corpus(20, unique=5, seed=17)
    make_dataset(ws, corpus.texts, parts=3)
    one = dedup(make_ctx, DedupConfig(method="simhash"), out="one")
    two = dedup(make_ctx, DedupConfig(method="simhash", run=RunsOn(workers=2)), out="two")
    for sub in ("", "removed"):
        assert read_table(two.final / sub).equals(read_table(one.final / sub))


def test_a_rerun_skips_finished_tasks(make_ctx, ws, monkeypatch):
    corpus = planted_corpus(20, unique=5, seed=16)
    make_dataset(ws, corpus.texts, parts=2)
    run_dedup(make_ctx(), DedupConfig(), phase="buckets")

    def must_not_run(self, task):
        raise AssertionError("a finished task ran again")

    monkeypatch.setattr(Signatures, "run", must_not_run)
    monkeypatch.setattr(Buckets, "run", must_not_run)
    b = dedup(make_ctx)
    assert b.stats["rows_in"] == len(corpus)


def test_a_phase_before_its_predecessor_is_a_user_error(make_ctx, ws):
    make_dataset(ws, ["a b c", "a b c"])
    with pytest.raises(UserError, match="phase signatures finished first"):
        run_dedup(make_ctx(), DedupConfig(run=RunsOn(rank=0, world_size=1)), phase="buckets")
    with pytest.raises(UserError, match="--phase"):
        run_dedup(make_ctx(), DedupConfig(run=RunsOn(rank=0, world_size=2)))


def test_cli_method_and_set_reach_the_config(ws):
    make_dataset(ws, ["Hello world", "hello world", "something else entirely"])
    app = build_app()
    r = CliRunner().invoke(app, ["dedup", "-w", str(ws), "--method", "exact",
                                 "--set", "exact.lowercase=true"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((ws / "dedup" / "manifest.json").read_text())
    assert manifest["config"]["method"] == "exact" and manifest["config"]["exact"]["lowercase"]
    assert manifest["stats"]["rows_removed"] == 1
    r = CliRunner().invoke(app, ["dedup", "-w", str(ws), "--rank", "0", "--world-size", "2"])
    assert r.exit_code == 2 and "--phase" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("phase,file,how", [
    ("signatures", "signatures/part-00001/values.bin", "removed"),
    ("filter", "filter/part-00000/kept/part-00000.parquet", "cut short")])
def test_a_task_whose_files_were_damaged_is_redone(make_ctx, ws, monkeypatch, phase, file, how):
    from llmkit.status import workspace_status

    corpus = planted_corpus(40, unique=10, seed=18)
    make_dataset(ws, corpus.texts, parts=2)
    straight = dedup(make_ctx, out="straight")
    for p in PHASES:  # every task done, nothing assembled
        run_dedup(make_ctx(out="split"), DedupConfig(run=RunsOn(rank=0, world_size=1)), phase=p)
    [work] = (ws / ".work").glob("split-*")
    damaged = work / file
    if how == "removed":
        damaged.unlink()
    else:
        damaged.write_bytes(damaged.read_bytes()[:100])
    [row] = [r for r in workspace_status(make_ctx().workspace) if r.name == "split (work)"]
    assert (row.stage, row.state) == ("dedup", "damaged") and row.size.endswith("1 damaged")

    redone = []
    unit = {"signatures": Signatures, "filter": Filter}[phase]
    real = unit.run
    monkeypatch.setattr(unit, "run", lambda self, task: redone.append(task) or real(self, task))
    split = dedup(make_ctx, out="split")
    assert redone == [int(file.split("part-")[1][:5])]  # that task only
    for sub in ("", "removed"):
        assert read_table(split.final / sub).equals(read_table(straight.final / sub))
    assert split.stats["rows_removed"] == straight.stats["rows_removed"] > 0
