import json
import random

import numpy as np
import pytest
import torch

from llmkit.errors import ConfigError, UserError
from llmkit.checkpoints import step_folders as ckpt
from llmkit.train.checkpoint import RUN_RECORD, plan_run
from llmkit.train.metrics import read_metrics
from tests.train.conftest import TinyLM, make_engine


def fake_step(run, step, complete=True):
    d = run / ckpt.step_dir_name(step)
    d.mkdir(parents=True)
    if complete:
        (d / ckpt.COMPLETE).write_text("")
    return d


def test_prune_keeps_the_newest_complete_and_clears_older_debris(tmp_path):
    for step in (1, 2, 3, 5):
        fake_step(tmp_path, step)
    fake_step(tmp_path, 4, complete=False)  # a save killed before step 5's
    fake_step(tmp_path, 6, complete=False)  # a save in progress: newer than every complete one
    removed = ckpt.prune_checkpoints(tmp_path, keep_last=2)
    assert sorted(p.name for p in removed) == ["step-00000001", "step-00000002", "step-00000004"]
    assert [p.name for p in ckpt.step_dirs(tmp_path)] == ["step-00000003", "step-00000005",
                                                            "step-00000006"]


def test_engine_writes_step_folders_latest_and_prunes_to_keep_last(tmp_path):
    run = tmp_path / "run"
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.model").write_bytes(b"spm")
    make_engine(run, max_steps=5, save_every=1, keep_last=2, tokenizer_dir=tokenizer).fit()
    assert [p.name for p in ckpt.step_dirs(run)] == ["step-00000004", "step-00000005"]
    assert (run / ckpt.LATEST).read_text() == "step-00000005\n"
    step = run / "step-00000005"
    assert ckpt.checkpoint_problem(step) is None
    assert json.loads((step / ckpt.MODEL_CONFIG).read_text()) == TinyLM().config
    state = json.loads((step / ckpt.TRAINER_STATE).read_text())
    assert state["step"] == 5 and state["tokens_seen"] == 5 * 4 * 8
    assert state["ranks"][0]["task"] == {"data": {"index": 5}}
    assert state["metrics"]["step"] == 5
    assert (step / "tokenizer" / "tokenizer.model").read_bytes() == b"spm"


def test_tied_weights_are_stored_once_and_restored_as_one_tensor(tmp_path):
    model = TinyLM()
    named = model.state_dict(keep_vars=True)
    tied = ckpt.tied_groups(named)
    assert tied == {"head.weight": "embed.weight"}
    ckpt.save_weights(tmp_path / "w.safetensors", named, tied)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "w.safetensors"), "pt") as f:
        assert "head.weight" not in f.keys()
    loaded = ckpt.read_weights(tmp_path / "w.safetensors")
    assert loaded["head.weight"] is loaded["embed.weight"]
    fresh = TinyLM()
    fresh.load_state_dict(loaded, strict=True)
    assert torch.equal(fresh.head.weight, model.embed.weight)


def test_load_weights_resolves_a_run_to_its_latest_checkpoint(tmp_path):
    run = tmp_path / "run"
    engine = make_engine(run, max_steps=4, save_every=2)
    engine.fit()
    weights, config = ckpt.load_weights(run)
    assert config == TinyLM().config
    assert torch.equal(weights["mix.weight"], engine.task.model.mix.weight.detach())
    older, _ = ckpt.load_weights(run / "step-00000002")
    assert not torch.equal(older["mix.weight"], weights["mix.weight"])
    with pytest.raises(UserError, match="no complete checkpoint"):
        ckpt.load_weights(tmp_path)


def test_truncated_weights_are_detected(tmp_path):
    path = tmp_path / "w.safetensors"
    ckpt.save_weights(path, {"a": torch.ones(100)}, {})
    assert ckpt.weights_problem(path) is None
    path.write_bytes(path.read_bytes()[:-10])
    assert "truncated" in ckpt.weights_problem(path)


def _remove_marker(step_dir):
    (step_dir / ckpt.COMPLETE).unlink()


def _truncate_weights(step_dir):
    path = step_dir / ckpt.WEIGHTS
    path.write_bytes(path.read_bytes()[:100])


def _damage_deepspeed_states(step_dir):
    (step_dir / ckpt.DEEPSPEED / "mp_rank_00_model_states.pt").write_bytes(b"garbage")


@pytest.mark.parametrize("damage", [_remove_marker, _truncate_weights, _damage_deepspeed_states])
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, damage):
    run = tmp_path / "run"
    make_engine(run, max_steps=4, save_every=2).fit()
    straight = [r["loss"] for r in read_metrics(run)]
    damage(run / "step-00000004")
    engine = make_engine(run, max_steps=4, save_every=2)
    engine.fit()
    assert "skipping checkpoint" in caplog.text and "step-00000004" in caplog.text
    assert [r["loss"] for r in read_metrics(run)] == straight  # steps 3-4 re-run identically
    assert ckpt.checkpoint_problem(run / "step-00000004") is None  # and re-saved whole


def test_resume_from_names_the_step_to_continue_from(tmp_path):
    run = tmp_path / "run"
    make_engine(run, max_steps=4, save_every=2).fit()
    engine = make_engine(run, max_steps=4, save_every=2, resume_from="step-00000002")
    engine.fit()
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]
    with pytest.raises(UserError, match="step-00000003"):
        make_engine(run, max_steps=4, resume_from="step-00000003").fit()


def test_rng_states_round_trip_through_json():
    state = json.loads(json.dumps(ckpt.rng_state()))
    expected = (random.random(), np.random.rand(), torch.rand(3))
    ckpt.set_rng_state(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert expected[:2] == again[:2] and torch.equal(expected[2], again[2])


# -- continuing a run with changed settings (checkpoint.plan_run) -----------------------------

RUN_CONFIG = {"max_steps": 8, "lr": 1e-3, "seed": 0, "model": {"hidden_size": 32, "n_layers": 2}}


def planned(tmp_path, *, config=None, fingerprint="aaa", record=True, resume_from=None,
            force=False, steps=(4, 8), defaults=None):
    """The plan for a rerun of a run dir holding complete `steps`, started with RUN_CONFIG on an
    input whose fingerprint was "aaa"; `config`/`fingerprint` are the rerun's."""
    from llmkit.train.config import TrainConfig
    from llmkit.core.workspace import Artifact, Workspace

    run = tmp_path / "run"
    run.mkdir(parents=True)
    for step in steps:
        fake_step(run, step)
    data = Artifact(tmp_path / "tokens", {"fingerprint": fingerprint})
    if record:
        (run / RUN_RECORD).write_text(json.dumps(
            {"config": RUN_CONFIG, "inputs": [{"path": "tokens", "fingerprint": "aaa"}],
             "changes": []}))
    b = Workspace(tmp_path).builder("run", stage="pretrain", config=config or RUN_CONFIG,
                                    inputs=[data], in_place=True, quiet=True)
    return plan_run(b, resume_from, TrainConfig.CONTINUABLE, force, defaults)


def test_rerun_with_the_same_settings_continues_from_the_newest_checkpoint(tmp_path):
    plan = planned(tmp_path)
    assert (plan.resume, plan.step, plan.changes) == (True, 8, {})


def test_a_setting_a_later_version_added_is_unchanged_at_its_default(tmp_path):
    """A run recorded before `lora` and `model.head_dim` existed: the same run while they keep
    their defaults (it was trained without them), another one when they are set."""
    newer = {**RUN_CONFIG, "lora": {"r": 0, "alpha": 16.0}, "model": {**RUN_CONFIG["model"], "head_dim": None}}
    defaults = {"lora.r": 0, "lora.alpha": 16.0, "model.head_dim": None}
    plan = planned(tmp_path / "a", config=newer, defaults=defaults)
    assert plan.resume and plan.step == 8 and plan.changes == {}
    with pytest.raises(ConfigError, match=r"other settings \(lora.r\)"):
        planned(tmp_path / "b", config={**newer, "lora": {"r": 8, "alpha": 16.0}}, defaults=defaults)
    with pytest.raises(ConfigError, match=r"other settings \(lora.alpha, lora.r\)"):
        planned(tmp_path / "c", config=newer)  # without the defaults: a new key is a change


def test_a_setting_this_version_no_longer_has_is_no_change(tmp_path):
    """ppo's top_k/top_p went (rollouts sample the whole distribution): a run that recorded
    them is still the same run, as nothing can set them now."""
    current = {k: v for k, v in RUN_CONFIG.items() if k != "seed"}  # else another run
    plan = planned(tmp_path, config=current)
    assert plan.resume and plan.step == 8 and plan.changes == {}


def test_extending_a_run_continues_it_and_names_the_changes(tmp_path):
    plan = planned(tmp_path, config={**RUN_CONFIG, "max_steps": 12, "lr": 5e-4})
    assert (plan.resume, plan.step) == (True, 8)
    assert plan.changes == {"lr": [1e-3, 5e-4], "max_steps": [8, 12]}


@pytest.mark.parametrize("change, named", [
    ({"model": {"hidden_size": 64, "n_layers": 2}}, "model.hidden_size"),
    ({"seed": 1}, "seed"),
    ({"max_steps": 12, "micro_batch_size": 2}, "micro_batch_size"),
])
def test_a_change_that_makes_another_run_is_refused_naming_the_keys_and_the_ways_out(
        tmp_path, change, named):
    with pytest.raises(ConfigError) as refused:
        planned(tmp_path, config={**RUN_CONFIG, **change})
    message = str(refused.value)
    assert named in message and "max_steps" not in message
    assert "--out NEW" in message and "--force" in message and "put the settings back" in message


def test_other_input_data_is_refused_naming_the_input(tmp_path):
    with pytest.raises(ConfigError, match=r"input .*tokens"):
        planned(tmp_path, fingerprint="bbb")


def test_force_and_a_folder_without_complete_checkpoints_start_fresh(tmp_path):
    assert not planned(tmp_path / "a", config={**RUN_CONFIG, "seed": 1}, force=True).resume
    assert not planned(tmp_path / "b", config={**RUN_CONFIG, "seed": 1}, steps=()).resume


def test_resume_from_names_a_complete_checkpoint_and_rewinds_only_with_force(tmp_path):
    with pytest.raises(ConfigError, match=r"step-00000009.*complete: step-00000004, step-00000008"):
        planned(tmp_path / "a", resume_from="step-00000009")
    with pytest.raises(ConfigError, match=r"rewinds .*step-00000008.*--force"):
        planned(tmp_path / "b", resume_from="step-00000004")
    rewind = planned(tmp_path / "b2", resume_from="step-00000004", force=True)
    assert (rewind.resume, rewind.step, [p.name for p in rewind.rewound]) == (True, 4, ["step-00000008"])
    assert planned(tmp_path / "b3", resume_from="step-00000008").rewound == []
    with pytest.raises(ConfigError, match=r"at step 8, past max_steps=6"):
        planned(tmp_path / "c", config={**RUN_CONFIG, "max_steps": 6})


def test_a_folder_that_does_not_record_its_settings_is_never_cleared(tmp_path):
    with pytest.raises(ConfigError, match="does not record its settings"):
        planned(tmp_path, record=False)
