"""The learning-rate schedules, and the warmup-stable-decay move the Smol playbook relies on: a
checkpoint of the stable phase, continued into a decay, is the run that decayed there."""

import shutil

import pytest

from llmkit.checkpoints import step_folders as ckpt
from llmkit.errors import ConfigError
from llmkit.train.config import TrainConfig, lr_at
from llmkit.train.metrics import read_metrics
from tests.train.test_pretrain import pretrain, token_workspace


def wsd(**settings) -> TrainConfig:
    return TrainConfig(max_steps=110, warmup_steps=10, lr=1.0, min_lr=0.1, lr_schedule="wsd", **settings)


def test_wsd_holds_the_peak_then_decays_over_its_last_steps():
    cfg = wsd(decay_steps=20)
    assert [lr_at(s, cfg) for s in (5, 10, 50, 90)] == pytest.approx([0.5, 1.0, 1.0, 1.0])
    assert lr_at(100, cfg) == pytest.approx(0.1 + 0.5 * 0.9)  # halfway through a linear decay
    assert lr_at(110, cfg) == pytest.approx(0.1)
    assert lr_at(95, wsd(decay_steps=20, decay_shape="sqrt")) == pytest.approx(0.1 + (1 - 0.5) * 0.9)
    assert lr_at(100, wsd(decay_steps=20, decay_shape="cosine")) == pytest.approx(0.1 + 0.5 * 0.9)
    assert lr_at(91, wsd()) == lr_at(91, wsd(decay_steps=20))  # None: a fifth of the steps after warmup
    assert lr_at(100, TrainConfig(max_steps=110, warmup_steps=10, lr_schedule="constant")) == 3e-4


@pytest.mark.parametrize("settings, named", [
    ({"lr_schedule": "linear"}, "lr_schedule"),
    ({"lr_schedule": "wsd", "decay_shape": "exp"}, "decay_shape"),
    ({"lr_schedule": "wsd", "decay_steps": 101}, "decay_steps"),
    ({"lr_schedule": "wsd", "decay_steps": 0}, "decay_steps"),
])
def test_a_schedule_setting_out_of_range_is_named(settings, named):
    with pytest.raises(ConfigError, match=named):
        TrainConfig(max_steps=110, warmup_steps=10, **settings)


def test_a_stable_checkpoint_continued_into_its_decay_is_the_run_that_decayed_there(tmp_path):
    ws = token_workspace(tmp_path)
    schedule = ("lr_schedule=wsd", "decay_steps=4", "threads=1", "keep_last=0")
    pretrain(ws, "max_steps=10", *schedule, extra=("--out", "decayed"))
    pretrain(ws, "max_steps=16", *schedule, extra=("--out", "stable"))  # lr held through step 12
    shutil.copytree(ws / "stable", ws / "branch")  # the stable run stays as it is
    out = pretrain(ws, "max_steps=10", "resume_from=step-00000006", *schedule,
                   extra=("--out", "branch", "--force")).output
    assert "rewound to step 6" in out

    def steps(run):
        return {r["step"]: (r["loss"], r["lr"]) for r in read_metrics(ws / run) if "loss" in r}

    decayed, branch, stable = steps("decayed"), steps("branch"), steps("stable")
    assert branch == decayed  # losses and lr of all 10 steps, bitwise
    assert stable[8][1] > decayed[8][1]  # the stable run did not decay there
    for name in ("step-00000008", "step-00000010"):
        assert (ws / "branch" / name / ckpt.WEIGHTS).read_bytes() == (ws / "decayed" / name / ckpt.WEIGHTS).read_bytes()
    assert ckpt.is_complete(ws / "stable" / "step-00000016")
