import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llmkit.errors import ConfigError
from llmkit.checkpoints import step_folders as ckpt
from llmkit.train.distributed import free_port
from llmkit.train.config import TrainConfig, lr_at
from llmkit.train.engine import TrainingDiverged, TrainingInterrupted
from llmkit.train.metrics import read_metrics

from tests.train.conftest import REPO, make_engine

CONFTEST = Path(__file__).with_name("conftest.py")
COMPARED = ("step", "loss", "lr", "grad_norm", "accuracy", "skipped_steps", "tokens_seen")


TEARDOWN_ABORT = "terminate called without an active exception"


def run_script(*runs, launcher=()):
    """Train (run_dir, options) pairs one after the other in a fresh process, optionally under
    a launcher; returns the finished process."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                             "MASTER_ADDR", "MASTER_PORT")}
    args = [str(a) if isinstance(a, Path) else json.dumps(a) for run in runs for a in run]
    cmd = [*(launcher or [sys.executable]), str(CONFTEST), *args]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if launcher and TEARDOWN_ABORT in done.stderr:
        # a process of the group aborted as it ended (a C++ thread of the gloo stack still joinable);
        # seen once in CI, never in 30 runs here, and not llmkit's to fix. A run the first attempt
        # finished resumes at its end and trains nothing: its metrics stay the first attempt's.
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return done


def losses(run_dir, keys=COMPARED):
    return [{k: r.get(k) for k in keys} for r in read_metrics(run_dir)]


def test_lr_warms_up_linearly_then_decays_by_cosine_to_min_lr():
    cfg = TrainConfig(max_steps=110, lr=1.0, min_lr=0.1, warmup_steps=10)
    assert lr_at(1, cfg) == pytest.approx(0.1)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.1 + 0.5 * 0.9)  # halfway through the cosine
    assert lr_at(110, cfg) == pytest.approx(0.1)


@pytest.mark.parametrize("bad", [
    {"precision": "fp8"}, {"zero_stage": 4}, {"offload_params": True, "zero_stage": 2},
    {"offload_optimizer": True}, {"min_lr": 1.0, "lr": 0.1}, {"warmup_steps": 20, "max_steps": 10},
    {"resume_from": "latest"}, {"grad_accum": 0}, {"betas": (0.9, 1.5)},
])
def test_invalid_train_config_is_rejected(bad):
    with pytest.raises(ConfigError):
        TrainConfig(**bad)


def test_loss_falls_parameters_change_and_metrics_are_logged(tmp_path):
    engine = make_engine(tmp_path / "run", max_steps=30, dropout=0.0)
    before = {k: v.clone() for k, v in engine.task.model.state_dict().items()}
    result = engine.fit()
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == list(range(1, 31))
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "data_s", "step_s", "accuracy"):
        assert all(isinstance(r[key], float) for r in records), key
    assert sum(r["loss"] for r in records[-5:]) / 5 < 0.5 * records[0]["loss"]
    assert records[-1]["tokens_seen"] == 30 * 4 * 8 == result.tokens_seen
    assert records[0]["mfu"] == pytest.approx(
        6 * engine.n_params * records[0]["tokens_per_s"] / 1e9)
    after = engine.task.model.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before)
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert result.checkpoint == tmp_path / "run" / "step-00000030"


def test_zero_stages_and_bf16_agree_on_first_losses(tmp_path):
    first = {}
    for stage in (0, 1, 2, 3):
        make_engine(tmp_path / f"z{stage}", zero_stage=stage, max_steps=4, transformer=True).fit()
        first[stage] = [r["loss"] for r in read_metrics(tmp_path / f"z{stage}")]
    for stage in (1, 2, 3):
        assert first[stage] == pytest.approx(first[0], rel=1e-4), stage
    make_engine(tmp_path / "bf16", zero_stage=2, precision="bf16", max_steps=4, transformer=True).fit()
    assert [r["loss"] for r in read_metrics(tmp_path / "bf16")] == pytest.approx(first[0], rel=0.05)
    z3 = ckpt.read_weights(tmp_path / "z3" / "step-00000004" / ckpt.WEIGHTS)
    z0 = ckpt.read_weights(tmp_path / "z0" / "step-00000004" / ckpt.WEIGHTS)
    assert z3.keys() == z0.keys() and "lm_head.weight" in z3
    assert all(torch.allclose(z3[k], z0[k], atol=1e-5) for k in z0)


def test_activation_checkpointing_recomputes_to_the_same_losses(tmp_path):
    plain = make_engine(tmp_path / "plain", max_steps=3, transformer=True)
    plain.fit()
    recomputed = make_engine(tmp_path / "ckpt", max_steps=3, transformer=True,
                             activation_checkpointing=True)
    recomputed.fit()
    assert recomputed.task.model.gradient_checkpointing and not plain.task.model.gradient_checkpointing
    assert [r["loss"] for r in read_metrics(tmp_path / "ckpt")] == pytest.approx(
        [r["loss"] for r in read_metrics(tmp_path / "plain")], rel=1e-5)


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_nan_step_is_skipped_counted_and_training_goes_on(tmp_path, zero_stage):
    # grad_accum 2: batch 5 is the first micro-batch of step 3, which must be skipped whole
    engine = make_engine(tmp_path / "run", grad_accum=2, nan_batches={5}, zero_stage=zero_stage,
                         max_steps=5)
    result = engine.fit()
    records = read_metrics(tmp_path / "run")
    assert math.isnan(records[2]["loss"])
    assert [r["skipped_steps"] for r in records] == [0, 0, 1, 1, 1]
    assert result.skipped_steps == 1
    assert all(torch.isfinite(p).all() for p in engine.task.model.parameters())
    assert math.isfinite(records[3]["loss"]) and records[4]["loss"] < records[0]["loss"]


def test_nan_step_leaves_weights_untouched(tmp_path):
    first = make_engine(tmp_path / "run", max_steps=1)
    first.fit()
    resumed = make_engine(tmp_path / "run", max_steps=2, nan_batches={1})  # its first batch: step 2
    resumed.fit()
    assert resumed.skipped_steps == 1
    after_one = first.task.model.state_dict()
    for k, v in resumed.task.model.state_dict().items():
        assert torch.equal(v, after_one[k]), k


def test_consecutive_bad_steps_stop_with_last_good_checkpoint_intact(tmp_path):
    run = tmp_path / "run"
    engine = make_engine(run, max_steps=10, save_every=2, max_bad_steps=2, nan_batches={5, 6})
    with pytest.raises(TrainingDiverged, match="step-00000004"):
        engine.fit()
    assert ckpt.read_latest(run) == "step-00000004"
    assert ckpt.checkpoint_problem(run / "step-00000004") is None
    assert not (run / "step-00000006").exists()
    weights, _ = ckpt.load_weights(run)
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert [r["skipped_steps"] for r in read_metrics(run)] == [0, 0, 0, 0, 1, 2]


def test_sigterm_saves_the_current_step_then_stops(tmp_path):
    run = tmp_path / "run"
    engine = make_engine(run, max_steps=10, save_every=0)
    original = engine.task.next_batch

    def next_batch(model):
        if engine.task.batches_drawn == 2:  # during step 3
            os.kill(os.getpid(), 15)
        return original(model)

    engine.task.next_batch = next_batch
    with pytest.raises(TrainingInterrupted):
        engine.fit()
    assert ckpt.read_latest(run) == "step-00000003"
    assert ckpt.checkpoint_problem(run / "step-00000003") is None


def test_eval_logs_val_loss_and_perplexity_without_changing_training(tmp_path):
    make_engine(tmp_path / "plain", max_steps=4).fit()
    make_engine(tmp_path / "eval", max_steps=4, eval_every=2, eval_batches=True).fit()
    plain, evaluated = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "eval")
    assert [r["loss"] for r in evaluated] == [r["loss"] for r in plain]
    assert [("val_loss" in r) for r in evaluated] == [False, True, False, True]
    last = evaluated[-1]
    assert last["val_ppl"] == pytest.approx(math.exp(last["val_loss"]))
    assert 0 <= last["val_accuracy"] <= 1


def test_new_run_from_existing_weights_starts_where_they_left_off(tmp_path):
    make_engine(tmp_path / "first", max_steps=20, dropout=0.0).fit()
    trained_loss = read_metrics(tmp_path / "first")[-1]["loss"]
    weights, _ = ckpt.load_weights(tmp_path / "first")
    make_engine(tmp_path / "second", max_steps=1, dropout=0.0, init_state_dict=weights).fit()
    fresh_loss = read_metrics(tmp_path / "first")[0]["loss"]
    second = read_metrics(tmp_path / "second")[0]["loss"]
    assert abs(second - trained_loss) < 0.3 * (fresh_loss - trained_loss)


def test_planned_tokens_far_below_twenty_per_parameter_warn(tmp_path, caplog):
    engine = make_engine(tmp_path / "run", max_steps=1)
    engine.task.warn_undertrained = True
    engine.fit()
    assert "20 tokens per parameter" in caplog.text


def test_killed_run_resumes_to_the_same_losses_bitwise(tmp_path):
    options = dict(max_steps=10, save_every=3)
    make_engine(tmp_path / "straight", **options).fit()
    killed = run_script((tmp_path / "killed", {**options, "kill_at_batch": 8}))
    assert killed.returncode == -9
    assert ckpt.read_latest(tmp_path / "killed") == "step-00000006"
    assert [r["step"] for r in read_metrics(tmp_path / "killed")] == list(range(1, 8))
    resumed = run_script((tmp_path / "killed", options))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert losses(tmp_path / "killed") == losses(tmp_path / "straight")
    a = ckpt.read_weights(tmp_path / "killed" / "step-00000010" / ckpt.WEIGHTS)
    b = ckpt.read_weights(tmp_path / "straight" / "step-00000010" / ckpt.WEIGHTS)
    assert all(torch.equal(a[k], b[k]) for k in b)


@pytest.mark.slow
def test_two_processes_zero2_and_zero3_match_one_process_with_the_same_global_batch(tmp_path):
    make_engine(tmp_path / "one", max_steps=4, grad_accum=2, transformer=True).fit()
    one = read_metrics(tmp_path / "one")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(free_port())]
    runs = [(tmp_path / f"two-z{stage}", {"max_steps": 4, "transformer": True, "zero_stage": stage})
            for stage in (2, 3)]
    done = run_script(*runs, launcher=torchrun)
    assert done.returncode == 0, done.stderr[-3000:]
    for run_dir, _ in runs:
        two = read_metrics(run_dir)
        assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-5)
        assert [r["tokens_seen"] for r in two] == [r["tokens_seen"] for r in one]
        assert ckpt.checkpoint_problem(run_dir / "step-00000004") is None
        state = json.loads((run_dir / "step-00000004" / ckpt.TRAINER_STATE).read_text())
        assert [r["task"]["data"]["index"] for r in state["ranks"]] == [4, 4]
        gathered = ckpt.read_weights(run_dir / "step-00000004" / ckpt.WEIGHTS)
        reference = ckpt.read_weights(tmp_path / "one" / "step-00000004" / ckpt.WEIGHTS)
        assert gathered.keys() == reference.keys()
        assert all(torch.allclose(gathered[k], reference[k], atol=1e-5) for k in reference)


@pytest.mark.slow
def test_ranks_resume_from_the_newest_checkpoint_every_rank_can_read(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(free_port())]
    run, options = tmp_path / "run", {"max_steps": 4, "save_every": 2, "transformer": True}
    assert run_script((run, options), launcher=torchrun).returncode == 0
    os.environ["LLMKIT_DIST_TIMEOUT"] = "60"  # without agreement the ranks would hang, not fail
    try:
        done = run_script((run, {**options, "max_steps": 6, "unreadable_on_rank": [1, "step-00000004"]}),
                          launcher=torchrun)
    finally:
        del os.environ["LLMKIT_DIST_TIMEOUT"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stdout + done.stderr and "step-00000002 (step 2)" in done.stdout + done.stderr
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4, 5, 6]


GOLDEN = REPO / "tests" / "assets" / "golden_losses.json"
GOLDEN_RUN = dict(max_steps=8, transformer=True, weight_decay=0.1, grad_clip=1.0)  # fp32, ZeRO-0


def test_a_fresh_run_reproduces_the_golden_loss_curve(tmp_path):
    """The first losses of a tiny fixed fp32 run (torchtitan keeps such curves in its test assets):
    any change to the model, loss, optimizer, schedule, clipping or data order shows here.
    When a change to training numerics is intended, regenerate the file and commit it with the
    change that explains it:
        LLMKIT_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/train/test_engine.py -k golden
    """
    make_engine(tmp_path / "run", **GOLDEN_RUN).fit()
    records = read_metrics(tmp_path / "run")
    curve = {"losses": [r["loss"] for r in records], "grad_norms": [r["grad_norm"] for r in records]}
    if os.environ.get("LLMKIT_REGENERATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({
            "about": "tests/train/test_engine.py::test_a_fresh_run_reproduces_the_golden_loss_curve; "
                     "make_engine(**run) of tests/train/conftest.py",
            "run": GOLDEN_RUN, "torch": torch.__version__, **curve}, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert golden["run"] == GOLDEN_RUN, "the run changed: regenerate the golden file (see above)"
    assert curve["losses"] == pytest.approx(golden["losses"], abs=1e-6, rel=0)
    assert curve["grad_norms"] == pytest.approx(golden["grad_norms"], abs=1e-5, rel=0)


# -- the optimizer against hand formulas ---------------------------------------------------------


def reference_run(cfg, steps: int, clip: bool = True):
    """TinyLM (no dropout) trained on the engine's tiny task by hand: cross-entropy, the global
    gradient norm clipped as g · min(1, c / (‖g‖ + 1e-6)), then torch's reference AdamW with
    matrices decayed and norms / biases not. Returns the model and the pre-clip norms."""
    import torch.nn.functional as F

    from tests.train.conftest import StreamBatches, TinyLM
    from llmkit.train.distributed import seed_everything

    seed_everything(cfg.seed)
    model = TinyLM(dropout=0.0)
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=cfg.lr, betas=cfg.betas, eps=1e-8, foreach=False)
    data, norms = iter(StreamBatches(cfg.micro_batch_size)), []
    for step in range(1, steps + 1):
        batch = next(data)
        logits = model(torch.from_numpy(batch["input_ids"]).long())
        loss = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(batch["labels"]).long().flatten())
        opt.zero_grad()
        loss.backward()
        norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))
        norms.append(norm)
        if clip:
            for p in params:
                p.grad.mul_(min(1.0, cfg.grad_clip / (norm + 1e-6)))
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        opt.step()
    return model, norms


@pytest.mark.parametrize("zero_stage", [0, 1])  # the guarded fused AdamW; DeepSpeed's ZeRO optimizer
def test_clipped_updates_equal_the_hand_formula(tmp_path, zero_stage):
    engine = make_engine(tmp_path / "run", dropout=0.0, max_steps=4, grad_clip=0.05, weight_decay=0.1,
                         zero_stage=zero_stage)
    engine.fit()
    expected, norms = reference_run(engine.cfg, 4)
    assert min(norms) > 10 * engine.cfg.grad_clip  # every step clipped, each by its own factor
    assert [r["grad_norm"] for r in read_metrics(tmp_path / "run")] == pytest.approx(norms, rel=1e-4)
    unclipped, _ = reference_run(engine.cfg, 4, clip=False)
    got = dict(engine.task.model.named_parameters())
    for name, p in expected.named_parameters():
        torch.testing.assert_close(got[name], p, atol=2e-6, rtol=1e-5, msg=name)
    assert any((dict(unclipped.named_parameters())[n] - p).abs().max() > 1e-4
               for n, p in expected.named_parameters())  # clipping changed the run


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_weight_decay_shrinks_matrices_and_leaves_norms_and_biases(tmp_path, zero_stage):
    """With zero gradients AdamW's step is the decay alone: p ← p·(1 − lr·wd) for matrices."""
    engine = make_engine(tmp_path / "run", max_steps=1, weight_decay=0.5, lr=0.1, min_lr=0.01,
                         zero_stage=zero_stage)
    engine.task.loss = lambda model, batch: (sum(p.sum() for p in model.parameters()) * 0.0, {})
    before = {n: p.detach().clone() for n, p in engine.task.model.named_parameters()}
    engine.fit()
    after = dict(engine.task.model.named_parameters())
    assert sorted(n for n, p in before.items() if p.dim() >= 2) == ["embed.weight", "mix.weight"]
    for name, p in before.items():
        shrink = 1 - 0.1 * 0.5 if p.dim() >= 2 else 1.0  # the head is tied to embed.weight
        torch.testing.assert_close(after[name].detach(), p * shrink, rtol=1e-6, atol=0, msg=name)


def test_log_every_with_resume_writes_the_metrics_of_an_uninterrupted_run(tmp_path):
    options = dict(max_steps=10, log_every=3, save_every=4)
    make_engine(tmp_path / "straight", **options).fit()
    stopped = make_engine(tmp_path / "stopped", **options)
    original = stopped.task.next_batch

    def next_batch(model):
        if stopped.task.batches_drawn == 4:  # during step 5, between two checkpoints
            os.kill(os.getpid(), signal.SIGTERM)
        return original(model)

    stopped.task.next_batch = next_batch
    with pytest.raises(TrainingInterrupted):
        stopped.fit()
    assert ckpt.read_latest(tmp_path / "stopped") == "step-00000005"
    make_engine(tmp_path / "stopped", **options).fit()
    assert [r["step"] for r in read_metrics(tmp_path / "straight")] == [3, 6, 9, 10]
    assert losses(tmp_path / "stopped") == losses(tmp_path / "straight")
