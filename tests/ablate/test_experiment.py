"""The experiment file is checked before anything runs (bad input exits 2 naming it), and the
planner names each run and shares a run where two cells resolve to the same one."""

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmkit.ablate.experiment import read_experiment
from llmkit.ablate.plan import make_plan
from llmkit.cli.app import build_app
from llmkit.core.workspace import Workspace

BASE = {"stage": "pretrain", "args": ["--in", "tokens"], "baseline": {"max_steps": 12, "model": {"preset": "tiny"}},
        "variants": {"wsd": {"lr_schedule": "wsd"}, "masked": {"doc_masking": True}}, "seeds": [0, 1],
        "metric": "val_loss"}


def write(tmp_path: Path, data) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False) if isinstance(data, dict) else data)
    return path


def ablate(tmp_path: Path, data) -> str:
    result = CliRunner().invoke(build_app(), ["ablate", str(write(tmp_path, data)), "-w", str(tmp_path / "ws")])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    return result.output


@pytest.mark.parametrize("change, said", [
    ({"stage": "pretrian"}, "unknown stage 'pretrian'; did you mean 'pretrain'?"),
    ({"stage": "report"}, "unknown stage 'report'"),
    ({"variants": {"wsd": {"lr_shedule": "wsd"}}}, "wsd (pretrain settings): unknown key 'lr_shedule'; did you mean 'lr_schedule'"),
    ({"baseline": {"max_step": 12}}, "baseline (pretrain settings): unknown key 'max_step'"),
    ({"variants": {"wsd": {"lr_schedule": "wsdd"}}}, "lr_schedule must be one of"),
    ({"variants": {"same": {"max_steps": 12}}}, "variant 'same' resolves to the same settings and inputs as 'baseline'"),
    ({"variants": {"a": {"lr_schedule": "wsd"}, "b": {"lr_schedule": "wsd"}}}, "variant 'b' resolves to the same"),
    ({"variants": {}}, "variants must be a mapping"),
    ({"seeds": 0}, "seeds is 0"),
    ({"seeds": []}, "seeds must be a non-empty list"),
    ({"seeds": [1, 1]}, "seeds lists a seed twice"),
    ({"variants": {"s": {"seed": 3}}}, "s sets seed"),
    ({"metric": []}, "metric must name a key"),
    ({"metric": "sft:val_loss"}, "metric 'sft:val_loss' names step 'sft'"),
    ({"args": ["--in", "tokens", "--out", "x"]}, "args give --out, which ablate sets"),
    ({"variantz": {}}, "unknown key 'variantz'; did you mean 'variants'?"),
])
def test_bad_experiment_files_exit_2_naming_the_key(tmp_path, change, said):
    out = ablate(tmp_path, {**BASE, **change})
    assert said in out and "exp.yaml" in out, out
    assert not (tmp_path / "ws" / "ablate").exists()  # refused before anything is written


def test_a_missing_or_unreadable_file_exits_2(tmp_path):
    result = CliRunner().invoke(build_app(), ["ablate", str(tmp_path / "none.yaml"), "-w", str(tmp_path)])
    assert result.exit_code == 2 and "experiment file" in result.output and "does not exist" in result.output
    assert "is not valid YAML" in ablate(tmp_path, "stage: [pretrain\n")
    assert "must be a mapping" in ablate(tmp_path, "- pretrain\n")


def test_a_chain_refers_to_earlier_steps_only(tmp_path):
    chain = {"steps": [{"stage": "pretrain", "args": ["--in", "tokens"]},
                       {"stage": "sft", "args": ["--from", "{eval}", "--in", "sft_train"]}],
             "variants": {"wsd": {"pretrain": {"lr_schedule": "wsd"}}}, "seeds": 1, "metric": "val_loss"}
    assert "args name {eval}, which is no earlier step (pretrain)" in ablate(tmp_path, chain)


def test_one_stage_runs_every_variant_and_seed(tmp_path):
    plan = make_plan(read_experiment(write(tmp_path, BASE)), Workspace(tmp_path), tmp_path / "abl" / "runs")
    assert [r.name for r in plan.runs] == ["baseline-s0", "baseline-s1", "wsd-s0", "wsd-s1", "masked-s0", "masked-s1"]
    wsd = plan.run("wsd-s1")
    assert wsd.settings == ["seed=1", "max_steps=12", "model.preset=tiny", "lr_schedule=wsd"]
    assert wsd.command(Path("/ws"), Path("/ws/abl/runs")) == [
        "pretrain", "--in", "tokens", "-w", "/ws", "--out", "/ws/abl/runs/wsd-s1", "--set", "seed=1", "--set",
        "max_steps=12", "--set", "model.preset=tiny", "--set", "lr_schedule=wsd"]
    assert plan.cells[("masked", 0)] == {"pretrain": "masked-s0"}


def test_a_chain_shares_the_runs_whose_settings_and_inputs_are_equal(tmp_path):
    chain = {"steps": [{"stage": "pretrain", "args": ["--in", "tokens"], "baseline": {"max_steps": 12}},
                       {"stage": "sft", "args": ["--from", "{pretrain}", "--in", "sft_train"],
                        "baseline": {"max_steps": 5}}],
             "variants": {"sft_lr": {"sft": {"lr": 7e-5}}, "wsd": {"pretrain": {"lr_schedule": "wsd"}}},
             "seeds": [0, 1], "metric": ["sft:val_loss", "pretrain:val_loss"]}
    runs = tmp_path / "abl" / "runs"
    plan = make_plan(read_experiment(write(tmp_path, chain)), Workspace(tmp_path), runs)
    assert [r.name for r in plan.runs] == [
        "baseline-s0-pretrain", "baseline-s0-sft", "baseline-s1-pretrain", "baseline-s1-sft",
        "sft_lr-s0-sft", "sft_lr-s1-sft",  # their pretraining is the baseline's
        "wsd-s0-pretrain", "wsd-s0-sft", "wsd-s1-pretrain", "wsd-s1-sft"]
    assert plan.cells[("sft_lr", 1)] == {"pretrain": "baseline-s1-pretrain", "sft": "sft_lr-s1-sft"}
    sft = plan.run("sft_lr-s1-sft")
    assert sft.needs == ["baseline-s1-pretrain"]
    assert sft.args == ["--from", str((runs / "baseline-s1-pretrain").resolve()), "--in", "sft_train"]


def test_a_stage_without_a_seed_runs_once_for_every_seed(tmp_path):
    exp = {"stage": "tokenize", "args": ["--in", "dedup"], "baseline": {"val_fraction": 0.1},
           "variants": {"more_val": {"val_fraction": 0.2}}, "seeds": [0], "metric": "tokens"}
    plan = make_plan(read_experiment(write(tmp_path, exp)), Workspace(tmp_path), tmp_path / "runs")
    assert [r.name for r in plan.runs] == ["baseline-s0", "more_val-s0"]
    assert "no stage of it has a `seed`" in ablate(tmp_path, {**exp, "seeds": [0, 1]})


def test_a_variant_may_read_another_input_artifact(tmp_path):
    for name in ("tokens", "tokens_b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text('{"fingerprint": "f"}')
    exp = {**BASE, "variants": {"other": {"args": ["--in", "tokens_b"]}}}
    plan = make_plan(read_experiment(write(tmp_path, exp)), Workspace(tmp_path), tmp_path / "runs")
    assert plan.run("other-s0").args == ["--in", "tokens_b"] and plan.run("baseline-s0").args == ["--in", "tokens"]
    assert sorted(p.name for p in plan.inputs) == ["tokens", "tokens_b"]
