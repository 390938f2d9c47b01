"""`llmkit distill`: the divergences equal TRL's GKD loss (values and gradients), a stored top-k
teacher equals the whole teacher restricted to its top k, runs move the student towards the
teacher (full weights, LoRA, on-policy, prompts alone), resume bitwise after SIGKILL, and bad
input exits 2 naming the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from trl.experimental.gkd import GKDTrainer

from llmkit.checkpoints import step_folders as ckpt
from llmkit.core.config import parse_overrides
from llmkit.data.chat import IGNORE_INDEX, encode_sft_rows, sft_rows
from llmkit.errors import ConfigError, UserError
from llmkit.train.distill import DistillConfig, DistillTask, run_distill
from llmkit.train.distill_data import (TOP_K_DIR, DistillItem, collate_distill, precompute_top_k,
                                       prompts_of)
from llmkit.train.distill_losses import generalized_jsd, restricted_to_top_k, teacher_top_k
from llmkit.checkpoints.loading import load_model
from llmkit.train.metrics import read_metrics
from llmkit.train.task import to_device
from tests.train.posttrain_fixtures import (addition_rows, make_tokenizer, tiny_model,
                                            write_checkpoint_run, write_dataset)

pytestmark = pytest.mark.usefixtures("one_thread")
REL = 1e-5
FAST = ["max_steps=6", "micro_batch_size=4", "lr=2e-2", "min_lr=2e-3", "warmup_steps=1", "seq_len=64",
        "log_every=1", "eval_every=0", "eval_records=4", "max_new_tokens=4"]


@pytest.fixture
def ws(tmp_path, tok):
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "teacher", tiny_model(tok.vocab_size, seed=1, hidden_size=48, init_std=0.2), tok)
    write_checkpoint_run(ws, "student", tiny_model(tok.vocab_size, seed=2), tok)
    write_dataset(ws, "sft_train", addition_rows(32))
    write_dataset(ws, "sft_eval", addition_rows(4, seed=1, start=100))
    return ws


def distill(make_ctx, *pairs: str, out: str = "distill", data: str = "sft_train",
            eval_data: str | None = "sft_eval"):
    ctx = make_ctx(inputs=[data], out=out)
    ctx.overrides = parse_overrides([*FAST, *pairs])
    return run_distill(ctx, ctx.config(DistillConfig, "distill"), teacher="teacher", base="student",
                       eval_data=eval_data)


def cli(ws, *args: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LLMKIT_KILL_AT")}
    env.update(OMP_NUM_THREADS="1", **({"LLMKIT_KILL_AT": kill_at} if kill_at else {}))
    return subprocess.run([sys.executable, "-c", "from llmkit.cli.app import main; main()", "distill",
                           "-w", str(ws), *args], env=env, capture_output=True, text=True, timeout=600)


# -- the losses against TRL's GKDTrainer.generalized_jsd_loss ----------------------------------

def logits_and_labels(seed: int = 0, shape=(3, 7, 40)):
    g = torch.Generator().manual_seed(seed)
    student = (3 * torch.randn(shape, generator=g)).requires_grad_()
    teacher = (3 * torch.randn(shape, generator=g)).requires_grad_()
    labels = torch.randint(0, shape[-1], shape[:2], generator=g)
    labels[0, :3] = labels[2, 5:] = IGNORE_INDEX
    return student, teacher, labels


def ours_on_labelled(student, teacher, labels, beta, temperature, divergence=generalized_jsd):
    mask = labels != IGNORE_INDEX
    return divergence(student[mask], teacher[mask], beta, temperature).sum() / mask.sum()


def parity_gap(beta: float, temperature: float, divergence=generalized_jsd) -> float:
    """Largest relative difference between ours and TRL's loss and gradients (student, teacher)."""
    gaps = []
    for fn in (lambda s, t, y: GKDTrainer.generalized_jsd_loss(s, t, y, beta=beta, temperature=temperature),
               lambda s, t, y: ours_on_labelled(s, t, y, beta, temperature, divergence)):
        student, teacher, labels = logits_and_labels()
        loss = fn(student, teacher, labels)
        loss.backward()
        gaps.append((loss.detach(), student.grad, teacher.grad))
    return max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(*gaps))


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.7])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 0.3])
def test_divergence_and_its_gradients_equal_trls_gkd_loss(beta, temperature):
    assert parity_gap(beta, temperature) <= REL


@pytest.mark.parametrize("defect", [
    lambda s, t, beta, T: generalized_jsd(s, t, 1 - beta, T),  # the mixture weights swapped
    lambda s, t, beta, T: generalized_jsd(s / T, t, beta, 1.0),  # the teacher not softened
    lambda s, t, beta, T: generalized_jsd(s, t, beta, T) / s.shape[-1],  # a mean over the vocabulary
])
def test_a_planted_defect_fails_the_parity(defect):
    assert parity_gap(0.3, 2.0, defect) > 1e-3


def test_the_task_loss_is_trls_on_the_models_logits_plus_the_hard_label_mix(tok):
    """DistillTask.loss on a batch of chats = TRL's GKD loss on the two models' full logits with
    the shifted labels, mixed with the replies' cross-entropy by hard_label_weight."""
    student, teacher = tiny_model(tok.vocab_size, seed=2), tiny_model(tok.vocab_size, seed=1)
    examples, _ = encode_sft_rows(tok, addition_rows(6), 64)
    batch = to_device(collate_distill([DistillItem(e) for e in examples], tok.pad_id), "cpu")
    cfg = DistillConfig(loss_type="jsd", beta=0.3, temperature=2.0, hard_label_weight=0.25, seq_len=64)
    task = DistillTask(student, None, None, cfg, teacher, stop_ids=tok.stop_ids, pad_id=tok.pad_id)
    loss, metrics = task.loss(student, batch)
    ids, labels = batch["input_ids"], batch["labels"][:, 1:]
    with torch.no_grad():
        teacher_logits = teacher(ids)[:, :-1]
    student_logits = student(ids)[:, :-1]
    trl = GKDTrainer.generalized_jsd_loss(student_logits, teacher_logits, labels, beta=0.3, temperature=2.0)
    ce = torch.nn.functional.cross_entropy(student_logits.flatten(0, 1), labels.flatten())
    torch.testing.assert_close(metrics["divergence"], trl.detach(), rtol=REL, atol=1e-7)
    torch.testing.assert_close(loss, 0.75 * trl + 0.25 * ce, rtol=REL, atol=1e-7)


# -- the top-k teacher --------------------------------------------------------------------------

def test_top_k_restriction_is_trls_loss_on_the_top_k_and_the_rests_bucket():
    """The k + 1 outcomes (the teacher's top k, then the rest) of both softened distributions,
    written out as probabilities, through TRL's loss."""
    student, teacher, labels = logits_and_labels()
    mask, T = labels != IGNORE_INDEX, 2.0
    s, t = restricted_to_top_k(student[mask], *teacher_top_k(teacher[mask].detach(), 5, T), T)
    assert s.shape == t.shape == (mask.sum(), 6)
    ids = teacher.detach().topk(5, -1).indices

    def coarse(logits):  # log-probabilities of the k tokens and of the rest, as TRL-ready logits
        p = torch.softmax(logits / T, -1)
        top = p.gather(-1, ids)
        return T * torch.cat([top, 1 - top.sum(-1, keepdim=True)], -1).log()

    trl = GKDTrainer.generalized_jsd_loss(coarse(student), coarse(teacher.detach()), labels, beta=0.5,
                                          temperature=T)
    torch.testing.assert_close(generalized_jsd(s, t, 0.5, T).sum() / mask.sum(), trl, rtol=1e-4, atol=1e-6)


def test_a_students_mass_off_the_teachers_top_k_is_penalised():
    """A student equal to the teacher but for a large logit on a token the teacher ranks last —
    the token its greedy reply would pick — is far from the top-k teacher, not at it."""
    teacher = torch.randn(4, 40, generator=torch.Generator().manual_seed(0))
    student = teacher.clone()
    top = teacher_top_k(teacher, 5)
    assert (generalized_jsd(*restricted_to_top_k(student, *top), 0.0) < 1e-5).all()
    student.scatter_(-1, teacher.argmin(-1, keepdim=True), 50.0)
    assert (generalized_jsd(*restricted_to_top_k(student, *top), 0.0) > 1).all()


def test_precomputed_top_k_gives_the_loss_of_the_teacher_restricted_on_the_fly(tok):
    student, teacher = tiny_model(tok.vocab_size, seed=2), tiny_model(tok.vocab_size, seed=1)
    examples, _ = encode_sft_rows(tok, addition_rows(8), 64)
    items = [DistillItem(s) for s in sft_rows(examples, 64, packing=True)]
    precompute_top_k(teacher, items, k=8, vocab=tok.vocab_size, pad_id=tok.pad_id, batch_size=2,
                     device="cpu", temperature=1.5)
    assert [len(it.top_ids) for it in items] == [it.labelled for it in items]
    stored = to_device(collate_distill(items, tok.pad_id), "cpu")
    whole = {k: v for k, v in stored.items() if not k.startswith("top_")}
    cfg = DistillConfig(loss_type="reverse_kl", teacher_top_k=8, temperature=1.5, seq_len=64)
    on_the_fly = DistillTask(student, None, None, cfg, teacher, stop_ids=[], pad_id=tok.pad_id)
    from_store = DistillTask(student, None, None, cfg, None, stop_ids=[], pad_id=tok.pad_id)
    assert from_store.loss(student, stored)[0].item() == on_the_fly.loss(student, whole)[0].item()
    full = DistillTask(student, None, None, DistillConfig(loss_type="reverse_kl", temperature=1.5),
                       teacher, stop_ids=[], pad_id=tok.pad_id)
    assert full.loss(student, whole)[0].item() != on_the_fly.loss(student, whole)[0].item()


# the teacher's rows of 600 sequences of growing length, each batch's logits ~10 MB and freed
GROWTH_OF_PRECOMPUTE = """
import torch
from llmkit.data.chat import Example, IGNORE_INDEX
from llmkit.train.distill_data import DistillItem, precompute_top_k

def rss_mb():
    return int(dict(l.split(":", 1) for l in open("/proc/self/status"))["VmRSS"].split()[0]) / 1024

def teacher(input_ids, position_ids=None, doc_ids=None, logits_at=None):
    return torch.randn(int(logits_at.sum()), 8000)

items = [DistillItem(Example(list(range(40 + n // 8)), [IGNORE_INDEX] * 8 + list(range(32 + n // 8))))
         for n in range(600)]
before = rss_mb()
precompute_top_k(teacher, items, k=8, vocab=8000, pad_id=0, batch_size=8, device="cpu")
print(sum(it.top_logits.nbytes + it.top_ids.nbytes for it in items) / 2 ** 20, rss_mb() - before)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the process's RSS from /proc")
def test_precomputing_the_teacher_keeps_about_the_memory_of_its_rows():
    """A small array per item, allocated between batches of large freed logits, fragmented the
    heap: 2.7 MB of rows held 940 MB here, and the demo's 51 MB held 3.7 GB for the whole run."""
    out = subprocess.run([sys.executable, "-c", GROWTH_OF_PRECOMPUTE], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300, check=True)
    kept_mb, grown_mb = map(float, out.stdout.split())
    assert kept_mb == pytest.approx(2.7, abs=0.1)
    assert grown_mb < 300, f"precompute_top_k kept {kept_mb:.1f} MB of rows but grew by {grown_mb:.0f} MB"


def test_a_precomputed_teacher_run_trains_as_the_teacher_on_the_fly_and_keeps_its_store(make_ctx, ws):
    top_k = ["teacher_top_k=16", "packing=false", "max_steps=3", "eval_records=0"]
    distill(make_ctx, *top_k, out="fly")
    b = distill(make_ctx, *top_k, "precompute_teacher=true", out="stored")
    curve = lambda run: [r["loss"] for r in read_metrics(ws / run)]  # noqa: E731
    assert curve("stored") == pytest.approx(curve("fly"), rel=1e-6) and len(curve("fly")) == 3
    assert (ws / "stored" / TOP_K_DIR / "complete").is_file() and not (ws / "fly" / TOP_K_DIR).exists()
    assert b.stats["teacher_seconds"] > 0


# -- runs ---------------------------------------------------------------------------------------

def test_distill_brings_the_student_towards_the_teacher(make_ctx, ws):
    before, _ = load_model(ws / "student")
    b = distill(make_ctx, "loss_type=jsd", "beta=0.5", "max_steps=10")
    records = read_metrics(ws / "distill")
    assert records[-1]["divergence"] < 0.7 * records[0]["divergence"]
    after, step_dir = load_model(ws / "distill")
    assert all(not torch.equal(p, q) for p, q in zip(before.parameters(), after.parameters()))
    assert b.stats["steps"] == 10 and b.stats["eval_records"] == 4
    assert b.stats["teacher_accuracy"] is not None and b.stats["base_accuracy"] is not None
    assert b.stats["teacher_seconds"] > 0  # loading and scoring the teacher, held beside the student
    assert (step_dir / "tokenizer" / "tokenizer.model").is_file()
    assert json.loads((ws / "distill" / "manifest.json").read_text())["stage"] == "distill"
    assert distill(make_ctx, "loss_type=jsd", "beta=0.5", "max_steps=10").up_to_date


def test_a_lora_student_trains_only_its_adapters(make_ctx, ws):
    b = distill(make_ctx, "lora.r=4", "lora.alpha=8")
    step = ws / "distill" / "step-00000006"
    assert (step / ckpt.ADAPTER_WEIGHTS).is_file() and not (step / ckpt.WEIGHTS).exists()
    assert 0 < b.stats["trainable_share"] < 0.5
    records = read_metrics(ws / "distill")
    assert records[-1]["divergence"] < records[0]["divergence"]


def test_on_policy_batches_train_on_the_students_own_replies(make_ctx, ws, tok):
    distill(make_ctx, "on_policy=0.5", "packing=false", "max_steps=8")
    shares = [r["on_policy"] for r in read_metrics(ws / "distill")]
    assert set(shares) == {0.0, 1.0}  # a coin per batch, from (seed, batch)
    write_dataset(ws, "prompts", [{"id": f"q{i}", "prompt": f"What is {i}+{i}?", "answer": str(2 * i)}
                                  for i in range(12)])
    with pytest.raises(UserError, match="prompts without replies.*on_policy=1"):
        distill(make_ctx, out="p", data="prompts", eval_data=None)
    b = distill(make_ctx, "on_policy=1", "packing=false", out="p", data="prompts", eval_data=None)
    assert all(r["on_policy"] == 1.0 for r in read_metrics(ws / "p")) and b.stats["prompts"] == 12


def test_a_students_reply_replaces_the_last_reply_of_each_row(tok):
    rows = addition_rows(2)
    examples, _ = encode_sft_rows(tok, rows, 64)
    batch = collate_distill([DistillItem(e) for e in examples], tok.pad_id)
    for prompt, row, example in zip(prompts_of(batch), rows, examples):
        messages = [{"role": "user", "content": row["prompt"] or row["messages"][0]["content"]}]
        assert prompt == tok.encode_chat(messages, add_generation_prompt=True)[0]
        assert example.input_ids[:len(prompt)] == prompt


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_losses_and_weights(make_ctx, ws):
    """SIGKILL while the second checkpoint is written (step 4 of 6): the rerun resumes from step 2
    and ends on the losses and weights of a run never stopped, on-policy coins and samples too."""
    settings = ["save_every=2", "on_policy=0.5", "packing=false"]
    distill(make_ctx, *settings, out="straight")
    args = ["--teacher", "teacher", "--from", "student", "--in", "sft_train", "--eval", "sft_eval",
            "--out", "killed", *[a for p in [*FAST, *settings] for a in ("--set", p)]]
    assert cli(ws, *args, kill_at="checkpoint@2").returncode == -9
    assert ckpt.read_latest(ws / "killed") == "step-00000002"
    distill(make_ctx, *settings, out="killed")
    curve = lambda run: [(r["step"], r["loss"], r["grad_norm"], r["on_policy"])  # noqa: E731
                         for r in read_metrics(ws / run)]
    assert curve("killed") == curve("straight") and len(curve("straight")) == 6
    assert {r["on_policy"] for r in read_metrics(ws / "straight")} == {0.0, 1.0}
    a, b = (ckpt.read_weights(ws / run / "step-00000006" / ckpt.WEIGHTS) for run in ("killed", "straight"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_make_fragment_runs_distill_on_its_inputs(tmp_path):
    from tests.make_fragments import make_command

    for name in ("dpo", "student", "sft_train", "sft_eval"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
    assert make_command(tmp_path, "distill", "DISTILL_EVAL=sft_eval") == (
        f"llmkit distill --teacher dpo --from student --in sft_train --eval sft_eval --out distill "
        f"-w {tmp_path}")


# -- bad input ----------------------------------------------------------------------------------

def in_process(ws, *args: str):
    from typer.testing import CliRunner

    from llmkit.cli.app import build_app

    return CliRunner().invoke(build_app(), ["distill", "-w", str(ws), *args])


def test_a_teacher_with_another_tokenizer_exits_2_naming_the_fix(ws, tmp_path):
    other = make_tokenizer(tmp_path / "other", vocab_size=300)
    write_checkpoint_run(ws, "stranger", tiny_model(other.vocab_size), other)
    done = in_process(ws, "--teacher", "stranger", "--from", "student")
    assert done.exit_code == 2 and "Traceback" not in done.output
    assert "use different tokenizers" in done.output and "start the student (--from)" in done.output
    assert not (ws / "distill").exists()


def test_an_unknown_loss_exits_2_with_the_closest_name(ws):
    done = in_process(ws, "--teacher", "teacher", "--from", "student", "--set", "loss_type=revers_kl")
    assert done.exit_code == 2 and "did you mean 'reverse_kl'?" in done.output
    missing = in_process(ws, "--from", "student")
    assert missing.exit_code == 2 and "needs --teacher" in missing.output


@pytest.mark.parametrize("settings, phrase", [
    (dict(loss_type="forward_kl", beta=0.2), "beta applies to loss_type=jsd"),
    (dict(loss_type="jsd", beta=1.5), "beta must be in"),
    (dict(precompute_teacher=True), "set teacher_top_k"),
    (dict(precompute_teacher=True, teacher_top_k=8, on_policy=0.5), "on_policy=0"),
    (dict(temperature=0), "temperature"),
    (dict(on_policy=0.5, zero_stage=3), "ZeRO-3"),
])
def test_settings_that_cannot_work_are_refused(settings, phrase):
    with pytest.raises(ConfigError, match=phrase):
        DistillConfig(**settings)
