import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.model.transformer import Transformer
from llmkit.model.config import ModelConfig
from llmkit.checkpoints import step_folders as ckpt
from llmkit.train.metrics import read_metrics
from llmkit.train.pretrain import ModelSection, PretrainTask, packed_documents
from tests.train.conftest import REPO
from tests.conftest import write_jsonl
from tests.tokenizers.test_sentencepiece import small_corpus

TINY = ["model.preset=tiny", "model.hidden_size=32", "model.n_layers=2", "model.n_heads=2",
        "model.n_kv_heads=1", "model.intermediate_size=64", "model.max_seq_len=32", "seq_len=32",
        "micro_batch_size=4", "lr=2e-2", "min_lr=2e-3", "warmup_steps=2", "log_every=1",
        "eval_every=4", "eval_batches=2", "save_every=2"]


def llmkit(*args, expect=0):
    result = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert result.exit_code == expect, result.output
    return result


def pretrain(ws, *settings, expect=0, extra=()):
    sets = [a for s in (*TINY, *settings) for a in ("--set", s)]
    return llmkit("pretrain", "-w", ws, *extra, *sets, expect=expect)


def token_workspace(tmp: Path) -> Path:
    """Token shards of two sources (prose, code) with a val split, and their tokenizer."""
    docs = small_corpus(160)
    rows = [{"id": f"d{i}", "text": t, "source": "code" if i % 4 == 1 else "prose"}
            for i, t in enumerate(docs)]
    ws = tmp / "ws"
    llmkit("ingest", write_jsonl(tmp / "docs.jsonl", rows), "-w", ws, "--out", "dedup")
    llmkit("tokenizer", "-w", ws, "--in", "dedup", "--set", "vocab_size=400")
    llmkit("tokenize", "-w", ws, "--in", "dedup", "--set", "val_fraction=0.1")
    return ws


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return token_workspace(tmp_path_factory.mktemp("pretrain"))


@pytest.fixture(scope="module")
def trained(ws):
    pretrain(ws, "max_steps=8")
    return ws / "pretrain"


def test_stage_trains_a_complete_checkpoint_run(trained, ws):
    manifest = json.loads((trained / "manifest.json").read_text())
    stats = manifest["stats"]
    assert stats["steps"] == 8 and stats["tokens_seen"] == 8 * 4 * 32
    assert math.isclose(stats["val_ppl"], math.exp(stats["val_loss"]))
    assert set(stats["mixture"]) == {"code", "prose"}
    records = read_metrics(trained)
    assert records[-1]["loss"] < records[0]["loss"] - 0.5
    assert [r["step"] for r in records if "val_loss" in r] == [4, 8]
    assert ckpt.read_latest(trained) == "step-00000008"
    assert [p.name for p in ckpt.step_dirs(trained)] == ["step-00000004", "step-00000006",
                                                         "step-00000008"]
    step = trained / "step-00000008"
    assert (step / "tokenizer" / "tokenizer.model").read_bytes() == \
        (ws / "tokenizer" / "tokenizer.model").read_bytes()
    weights, config = ckpt.load_weights(trained)
    model = Transformer(ModelConfig(**config))
    model.load_state_dict(weights, strict=True)
    assert config["vocab_size"] == 400 and config["hidden_size"] == 32
    assert "up to date" in pretrain(ws, "max_steps=8").output


def test_a_run_records_its_threads_and_cpu_kernels_where_its_figures_are_read(trained, ws, tmp_path):
    import importlib.util

    from llmkit.train.threads import cpu_kernel_path

    stats = json.loads((trained / "manifest.json").read_text())["stats"]
    threads, kernels = stats["threads"], stats["cpu_kernels"]
    # a test worker pins OMP_NUM_THREADS=1 (tests/conftest.py), which the run names as its setting
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    assert threads["setting"] == (f"OMP_NUM_THREADS={omp}" if omp else "auto") and threads["start"] >= 1 and sum(threads["steps"].values()) == 8
    assert kernels == cpu_kernel_path("cpu") in ("llmkit-avx512", "torch")
    assert all(isinstance(r["threads"], int) for r in read_metrics(trained))  # each step's count
    shown = {line.split()[0]: line for line in llmkit("status", "-w", ws).output.splitlines() if line.strip()}
    assert " thread" in shown["pretrain"] and kernels in shown["pretrain"]
    llmkit("report", "pretrain", "-w", ws)
    report = next((ws / "report").rglob("summary.md")).read_text()
    assert "| CPU threads | CPU kernels |" in report and " thread" in report.split("CPU kernels |")[1]
    spec = importlib.util.spec_from_file_location("demo_summary", REPO / "recipes" / "demo" / "summary.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert demo.summary(ws)["threads"]["pretrain"] == {"threads": threads, "cpu_kernels": kernels}
    assert "pretrain " in demo.table(demo.summary(ws)).split("training CPU threads, kernels")[1]


def test_interrupted_stage_resumes_where_its_last_checkpoint_left_off(tmp_path, trained):
    import shutil

    run = tmp_path / "ws"
    shutil.copytree(trained.parent, run)
    straight = read_metrics(run / "pretrain")
    (run / "pretrain" / "manifest.json").unlink()  # as if killed after step 6's checkpoint
    shutil.rmtree(run / "pretrain" / "step-00000008")
    out = pretrain(run, "max_steps=8").output
    assert "resumed from" in out and "step-00000006" in out
    assert [r["loss"] for r in read_metrics(run / "pretrain")] == [r["loss"] for r in straight]
    threads = json.loads((run / "pretrain" / "manifest.json").read_text())["stats"]["threads"]
    assert sum(threads["steps"].values()) == 8  # steps 1-6 as the checkpoint recorded them, 7-8 now


def test_resume_from_with_force_rewinds_the_run_to_an_older_step(tmp_path, trained):
    import shutil

    run = tmp_path / "ws"
    shutil.copytree(trained.parent, run)
    straight = read_metrics(run / "pretrain")
    (run / "pretrain" / "manifest.json").unlink()
    out = pretrain(run, "max_steps=8", "resume_from=step-00000004", "log_every=2",
                   extra=["--force"]).output
    assert "rewound to step 4; removed step-00000006, step-00000008" in out
    assert "continuing from step 4 with log_every 1 -> 2" in out
    assert "resumed from" in out and "step-00000004" in out
    rewound = [r for r in read_metrics(run / "pretrain") if "loss" in r]
    assert [r["loss"] for r in rewound] == [r["loss"] for r in straight if r["step"] <= 4 or r["step"] % 2 == 0]


def test_from_starts_a_new_run_from_a_checkpoint(ws, trained):
    pretrain(ws, "max_steps=1", "warmup_steps=0", extra=["--from", "pretrain", "--out", "more"])
    first = read_metrics(ws / "more")[0]["loss"]
    before = read_metrics(trained)
    assert abs(first - before[-1]["loss"]) < 0.5 * (before[0]["loss"] - before[-1]["loss"])
    manifest = json.loads((ws / "more" / "manifest.json").read_text())
    assert manifest["from"].endswith("step-00000008")
    assert {i["path"] for i in manifest["inputs"]} >= {"pretrain"}  # relative to the workspace


def test_bad_settings_are_user_errors(ws):
    assert "unknown model preset" in pretrain(ws, "model.preset=huge", expect=2).output
    assert "max_seq_len" in pretrain(ws, "seq_len=64", expect=2, extra=["--out", "long"]).output
    assert "precision" in pretrain(ws, "precision=fp8", expect=2).output


def test_model_section_overrides_every_model_config_field():
    section = {f.name for f in dataclasses.fields(ModelSection)} - {"preset"}
    assert section == {f.name for f in dataclasses.fields(ModelConfig)}
    built = ModelSection(preset="tiny", n_layers=3).build(vocab_size=123)
    assert (built.n_layers, built.vocab_size, built.hidden_size) == (3, 123, 128)


def tiny_transformer(**overrides):
    torch.manual_seed(0)
    return Transformer(ModelConfig(**{**dict(vocab_size=50, hidden_size=16, n_layers=2, n_heads=2,
                                             n_kv_heads=1, intermediate_size=32, max_seq_len=16),
                                      **overrides}))


def test_loss_is_label_smoothed_cross_entropy_and_eval_loss_is_plain():
    model = tiny_transformer()
    batch = {"input_ids": torch.randint(0, 50, (2, 8)), "labels": torch.randint(0, 50, (2, 8))}
    eps = 0.1
    task = PretrainTask(model, None, None, seq_len=8, label_smoothing=eps)
    logp = model(batch["input_ids"]).log_softmax(-1)
    nll = -logp.gather(-1, batch["labels"][..., None]).mean()
    smoothed = (1 - eps) * nll + eps * (-logp.mean(-1)).mean()
    assert task.loss(model, batch)[0].item() == pytest.approx(smoothed.item(), rel=1e-5)
    assert task.eval_loss(model, batch)[0].item() == pytest.approx(nll.item(), rel=1e-5)


def test_packed_documents_begin_after_each_end_token():
    ids = torch.tensor([[5, 6, 2, 7, 2, 2, 8, 9], [2, 3, 4, 5, 6, 7, 8, 9]])
    doc_ids, positions = packed_documents(ids, end_id=2)
    assert doc_ids.tolist() == [[0, 0, 0, 1, 1, 2, 3, 3], [0, 1, 1, 1, 1, 1, 1, 1]]
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0, 0, 1], [0, 0, 1, 2, 3, 4, 5, 6]]


@pytest.mark.parametrize("layer_types", [None, ["linear_attention", "full_attention"]])
def test_doc_masking_scores_each_packed_document_as_if_alone(layer_types):
    hybrid = dict(layer_types=layer_types, linear_n_key_heads=2, linear_n_value_heads=2,
                  linear_key_head_dim=8, linear_value_head_dim=8) if layer_types else {}
    model = tiny_transformer(**hybrid).eval()
    documents = [[7, 8, 9, 2], [11, 12, 13, 14, 2], [15]]  # each ends with </s> (id 2); the last is cut
    ids = torch.tensor([sum(documents, [])])
    labels = torch.randint(0, 50, (1, 10))
    masked = PretrainTask(model, None, None, seq_len=10, document_end=2)
    with torch.no_grad():
        alone = torch.cat([model(torch.tensor([doc])) for doc in documents], dim=1)
        packed = model(ids, **masked.documents(ids))
        assert (packed - alone).abs().max() < 1e-5
        expected = F.cross_entropy(alone.flatten(0, 1), labels.flatten())
        assert masked.eval_loss(model, {"input_ids": ids, "labels": labels})[0].item() == pytest.approx(
            expected.item(), rel=1e-5)
        assert (model(ids) - alone).abs().max() > 1e-3  # without it, the later documents see the earlier


def test_a_doc_masked_run_trains_and_records_the_setting(ws):
    pretrain(ws, "max_steps=2", "doc_masking=true", extra=("--out", "masked"))
    manifest = json.loads((ws / "masked" / "manifest.json").read_text())
    assert manifest["config"]["doc_masking"] is True and manifest["stats"]["steps"] == 2


def test_a_staged_mixture_switches_after_its_step_and_resumes_inside_the_stage(ws, tmp_path):
    """After step 2 only `code` is drawn (4 steps x 4 samples); a run killed after step 4's
    checkpoint resumes to the uninterrupted run's losses."""
    import shutil

    stages = "mixture_stages=[{step: 2, weights: {code: 1}}]"
    pretrain(ws, "max_steps=6", stages, extra=("--out", "staged"))
    stats = json.loads((ws / "staged" / "manifest.json").read_text())["stats"]
    assert stats["mixture_stages"] == [{"step": 2, "mixture": {"code": 1.0, "prose": 0.0}}]
    first = stats["mixture"]  # two steps of 4 samples at the temperature mixture, then 16 of code
    assert stats["samples_by_source"]["code"] == 16 + round(8 * first["code"])
    assert sum(stats["samples_by_source"].values()) == 24
    run = tmp_path / "ws"
    shutil.copytree(ws, run, ignore=shutil.ignore_patterns("pretrain", "masked", "more", "long"))
    (run / "staged" / "manifest.json").unlink()
    shutil.rmtree(run / "staged" / "step-00000006")
    assert "step-00000004" in pretrain(run, "max_steps=6", stages, extra=("--out", "staged")).output
    assert [r["loss"] for r in read_metrics(run / "staged")] == [r["loss"] for r in read_metrics(ws / "staged")]
    bad = pretrain(ws, "max_steps=6", "mixture_stages=[{step: 6, weights: {code: 1}}]", expect=2,
                   extra=("--out", "bad")).output
    assert "mixture_stages[0]" in bad and "max_steps" in bad


def test_dry_run_counts_the_dense_mask_of_document_masking_on_cpu(ws):
    """On CPU a document-masked batch builds a [T, T] mask per sequence and layer (4 bytes each)."""
    def activations(*settings):
        out = pretrain(ws, *settings, extra=("--dry-run", "--out", "planned")).output
        return next(line for line in out.splitlines() if "activations" in line)
    assert activations("doc_masking=true") != activations()


def test_moe_loss_adds_the_load_balancing_loss():
    model = tiny_transformer(n_experts=4, experts_top_k=2)
    batch = {"input_ids": torch.randint(0, 50, (2, 8)), "labels": torch.randint(0, 50, (2, 8))}
    loss, metrics = PretrainTask(model, None, None, seq_len=8).loss(model, batch)
    plain = F.cross_entropy(model(batch["input_ids"]).flatten(0, 1), batch["labels"].flatten())
    assert metrics["aux_loss"] > 0
    assert loss.item() == pytest.approx(plain.item() + metrics["aux_loss"], rel=1e-5)


def copied_run(tmp_path, trained):
    import shutil

    shutil.copytree(trained.parent, tmp_path / "ws")
    return tmp_path / "ws"


def checkpoint_bytes(run) -> dict:
    """{step folder: its weights} of every complete checkpoint of a run."""
    return {p.name: (p / ckpt.WEIGHTS).read_bytes() for p in ckpt.step_dirs(run) if ckpt.is_complete(p)}


def test_extending_a_finished_run_continues_it_and_records_the_change(tmp_path, trained):
    ws = copied_run(tmp_path, trained)
    before = read_metrics(ws / "pretrain")
    out = pretrain(ws, "max_steps=10", "keep_last=0").output
    assert "resumed from" in out and "step-00000008" in out
    records = read_metrics(ws / "pretrain")
    assert records[:len(before)] == before  # steps 1-8 are not retrained
    change = {"event": "config_change", "step": 8,
              "changes": {"keep_last": [3, 0], "max_steps": [8, 10]}}
    assert records[len(before)] == change
    assert [r["step"] for r in records[len(before) + 1:]] == [9, 10]
    manifest = json.loads((ws / "pretrain" / "manifest.json").read_text())
    assert manifest["stats"]["steps"] == 10
    assert manifest["config_changes"] == [{"step": 8, "changes": change["changes"]}]
    assert [p.name for p in ckpt.step_dirs(ws / "pretrain")] == [
        "step-00000004", "step-00000006", "step-00000008", "step-00000010"]


def test_resume_from_the_latest_step_with_more_steps_keeps_the_run(tmp_path, trained):
    ws = copied_run(tmp_path, trained)
    kept = checkpoint_bytes(ws / "pretrain")
    pretrain(ws, "max_steps=10", "resume_from=step-00000008")
    assert ckpt.read_latest(ws / "pretrain") == "step-00000010"
    assert {k: v for k, v in checkpoint_bytes(ws / "pretrain").items() if k in kept} == {
        k: v for k, v in kept.items() if k != "step-00000004"}  # keep_last=3 pruned the oldest


@pytest.mark.parametrize("settings", [
    ("max_steps=8", "model.hidden_size=64"),            # another model: refused
    ("max_steps=10", "seq_len=16"),                     # another batch shape: refused
    ("max_steps=10", "resume_from=step-00000005"),      # no such checkpoint: refused
    ("max_steps=9", "resume_from=step-00000004"),       # a rewind without --force: refused
    ("max_steps=6",),                                   # behind the run: refused
])
def test_no_rerun_deletes_a_complete_checkpoint_without_force(tmp_path, trained, settings):
    ws = copied_run(tmp_path, trained)
    kept = checkpoint_bytes(ws / "pretrain")
    manifest = (ws / "pretrain" / "manifest.json").read_bytes()
    out = pretrain(ws, *settings, expect=2).output
    assert "Traceback" not in out
    assert checkpoint_bytes(ws / "pretrain") == kept
    assert (ws / "pretrain" / "manifest.json").read_bytes() == manifest


def test_an_incompatible_change_names_the_key_and_force_starts_over(tmp_path, trained):
    ws = copied_run(tmp_path, trained)
    out = pretrain(ws, "max_steps=2", "model.n_layers=1", expect=2).output
    assert "model.n_layers" in " ".join(out.split()) and "--out NEW" in out
    pretrain(ws, "max_steps=2", "model.n_layers=1", "save_every=0", extra=["--force"])
    assert [p.name for p in ckpt.step_dirs(ws / "pretrain")] == ["step-00000002"]
    assert [r["step"] for r in read_metrics(ws / "pretrain")] == [1, 2]


def test_a_corpus_without_a_validation_split_is_said_loudly(ws):
    llmkit("tokenize", "-w", ws, "--in", "dedup", "--out", "tokens_noval", "--set", "val_fraction=0")
    out = pretrain(ws, "max_steps=2", extra=["--in", "tokens_noval", "--out", "noval"]).output
    assert "no validation loss will be measured" in out
    assert "none (no validation split)" in out


def test_ctrl_c_saves_a_checkpoint_and_exits_130(ws):
    """SIGINT (Ctrl-C) finishes the step in progress, saves it, and exits 130 saying where the
    checkpoint is, without a traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time

    sets = [a for s in (*TINY, "max_steps=100000", "save_every=0", "eval_every=0")
            for a in ("--set", s)]
    cmd = [sys.executable, "-m", "llmkit", "pretrain", "-w", str(ws), "--out", "interrupted", *sets]
    run = ws / "interrupted"
    # a fresh process group: not the one earlier in-process runs left in this environment
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                             "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 120
        while not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text().strip():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "interrupted: stopped by signal 2" in err, err[-3000:]
    assert str(run) in err  # where the checkpoint is
    latest = ckpt.read_latest(run)
    assert latest is not None and ckpt.checkpoint_problem(run / latest) is None
    assert ckpt.step_of(run / latest) == read_metrics(run)[-1]["step"] >= 1
    assert not (run / "manifest.json").exists()  # stopped: the artifact is not complete
