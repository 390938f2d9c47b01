"""The general-ability gate (llmkit.train.gate): the start and the trained model scored on
held-out general files, both in the manifest, the stage failing (or warning) by how much."""

import json

import pytest

from llmkit.errors import UserError
from llmkit.train import gate as gate_module
from llmkit.train import stage as stage_module
from llmkit.train.gate import GateConfig, GateFailed, gate_scores
from llmkit.train.sft import SftConfig, run_sft
from tests.conftest import write_jsonl
from tests.train.posttrain_fixtures import addition_rows, tiny_model, write_checkpoint_run, write_dataset


@pytest.fixture
def setup(tmp_path, tok):
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "pretrain", tiny_model(tok.vocab_size), tok)
    write_dataset(ws, "sft_train", addition_rows(16))
    write_dataset(ws, "sft_eval", addition_rows(4, seed=1, start=100))
    write_jsonl(tmp_path / "general.jsonl", [{"prompt": f"What is {i}+1?", "references": [str(i + 1)]}
                                             for i in range(4)])
    return ws


def run(make_ctx, force=False, **overrides):
    from llmkit.core.config import parse_overrides

    base = dict(max_steps=3, micro_batch_size=4, lr=1e-2, min_lr=1e-3, warmup_steps=1, seq_len=64,
                log_every=1, eval_every=0, eval_records=0, max_new_tokens=4, threads=1)
    ctx = make_ctx(inputs=["sft_train"], force=force)
    ctx.overrides = parse_overrides([f"{k}={v}" for k, v in {**base, **overrides}.items()])
    return run_sft(ctx, ctx.config(SftConfig, "sft"), base="pretrain", eval_data="sft_eval")


def manifest(ws, name="sft") -> dict:
    return json.loads((ws / name / "manifest.json").read_text())


def scripted(monkeypatch, *scores):
    """gate_scores returning `scores` in turn (base, then run) for every file."""
    calls = iter(scores)

    def fake(model, tokenizer, arts, cfg, device):
        s = next(calls)
        return {"general": {"metric": cfg.gate.metric, "score": s, "rows": 4}}

    monkeypatch.setattr(stage_module, "gate_scores", fake)
    monkeypatch.setattr(gate_module, "gate_scores", fake)


def test_the_gate_scores_start_and_run_into_the_manifest(setup, make_ctx, tmp_path):
    run(make_ctx, **{"gate.files": tmp_path / "general.jsonl", "gate.tolerance": 0.99, "gate.max_new_tokens": 4})
    g = manifest(setup)["gate"]
    f = g["files"]["general"]
    assert f["metric"] == "contains" and f["rows"] == 4 and 0 <= f["base"] <= 1 and 0 <= f["run"] <= 1
    assert f["drop"] == pytest.approx(f["base"] - f["run"], abs=1e-4)
    assert g["passed"] and g["tolerance"] == 0.99 and g["start"].endswith("step-00000001")


def test_a_run_below_its_gate_fails_by_how_much_and_status_shows_it(setup, make_ctx, tmp_path, monkeypatch, capsys):
    from llmkit.core.workspace import Workspace
    from llmkit.report import summary_markdown
    from llmkit.status import print_status

    scripted(monkeypatch, 0.8, 0.5)
    with pytest.raises(GateFailed, match=r"general: contains 0.800 -> 0.500, 0.300 below its start "
                                         r"\(0.250 past the tolerance 0.05\)"):
        run(make_ctx, **{"gate.files": tmp_path / "general.jsonl"})
    g = manifest(setup)["gate"]  # the run is complete and says it fell below
    assert not g["passed"] and g["failed"] == ["general"] and g["files"]["general"]["drop"] == 0.3
    print_status(Workspace(setup))
    assert "sft: BELOW ITS GATE, general: 0.800 -> 0.500 (tolerance 0.05)" in capsys.readouterr().out
    run_dir = setup / "sft"
    assert "0.8 -> 0.5 BELOW GATE" in summary_markdown({run_dir: []}, [], {run_dir: manifest(setup)})


def test_gate_action_warn_goes_on(setup, make_ctx, tmp_path, monkeypatch, capsys):
    scripted(monkeypatch, 0.8, 0.5)
    run(make_ctx, **{"gate.files": tmp_path / "general.jsonl", "gate.action": "warn"})
    assert "warning: gate: sft fell below" in capsys.readouterr().err
    assert manifest(setup)["gate"]["action"] == "warn"


def test_a_missing_gate_file_is_named_and_nothing_is_written(setup, make_ctx, tmp_path):
    with pytest.raises(UserError, match=r"gate.files: .*nope.jsonl: no such file"):
        run(make_ctx, **{"gate.files": tmp_path / "nope.jsonl"})
    assert not (setup / "sft").exists()


def test_a_finished_run_given_a_gate_is_scored_without_retraining(setup, make_ctx, tmp_path, monkeypatch):
    run(make_ctx)
    metrics = (setup / "sft" / "metrics.jsonl").read_text()
    scripted(monkeypatch, 0.5, 0.5)
    b = run(make_ctx, **{"gate.files": tmp_path / "general.jsonl"})
    assert b.up_to_date and (setup / "sft" / "metrics.jsonl").read_text() == metrics
    assert manifest(setup)["gate"]["passed"]
    scripted(monkeypatch)  # the same gate again: the recorded result answers it, nothing is scored
    run(make_ctx, **{"gate.files": tmp_path / "general.jsonl"})
    scripted(monkeypatch, 0.9, 0.5)  # a new tolerance: scored again, and now it fails
    with pytest.raises(GateFailed, match="0.400 below"):
        run(make_ctx, **{"gate.files": tmp_path / "general.jsonl", "gate.tolerance": 0.1})
    assert manifest(setup)["gate"]["tolerance"] == 0.1


def test_choice_files_are_scored_by_accuracy(tok, tmp_path):
    from llmkit.data.input_files import eval_input
    from llmkit.core.workspace import Workspace
    from llmkit.train.config import TrainConfig

    path = write_jsonl(tmp_path / "mc.jsonl", [{"question": f"{i}+1=", "choices": [str(i + 1), "x"], "answer": 0}
                                               for i in range(3)])
    cfg = TrainConfig(gate=GateConfig(files=[str(path)]))
    scores = gate_scores(tiny_model(tok.vocab_size), tok, [eval_input(Workspace(tmp_path), str(path))], cfg, "cpu")
    assert scores["mc"]["metric"] == "acc" and scores["mc"]["rows"] == 3 and 0 <= scores["mc"]["score"] <= 1
