"""`llmkit kto` and `llmkit ingest --kind feedback`: KTO's loss against TRL 1.16's own KTOTrainer
(`compute_loss` on the same per-token log-probs, and on a whole tiny-model batch that TRL tokenised,
collated and paired itself), the stage on a tiny model, and the data of the wrong kind refused."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import transformers
from datasets import Dataset
from trl import KTOConfig, KTOTrainer
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.core.config import parse_overrides
from llmkit.data.chat import IGNORE_INDEX
from llmkit.data.preferences import collate_feedback, encode_feedback, mismatch_completions, mismatched_pair
from llmkit.data.ingest import IngestConfig, run_ingest
from llmkit.data.io import read_table
from llmkit.tokenizers.tokenizer_json import HFTokenizer
from llmkit.train.kto import KtoConfig, KtoTask, run_kto
from llmkit.train.kto_loss import kl_reference_point, kto_loss
from llmkit.checkpoints.loading import load_model
from tests.conftest import write_jsonl
from tests.tokenizers.test_tokenizer_json import GENERATION_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe
from tests.train.posttrain_fixtures import separable_pairs, tiny_model, write_checkpoint_run, write_dataset
from tests.train.test_trl_parity import assert_close, assert_same_weight_grads, llmkit_copy, tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")

# TRL's conversational unpaired preference rows, and the same rows as `ingest --kind feedback` stores them
FEEDBACK = [("what is the", " answer to it", True), ("hello world", " bye bye world", False),
            ("the model", " trains well on data", True), ("what is the", " no", False),
            ("hello world", " again", True)]
TRL_ROWS = [{"prompt": [{"role": "user", "content": p}], "completion": [{"role": "assistant", "content": c}],
             "label": label} for p, c, label in FEEDBACK]
ROWS = [{"prompt": p, "completion": c, "label": label} for p, c, label in FEEDBACK]
SETTINGS = dict(beta=0.3, desirable_weight=1.4, undesirable_weight=0.6)  # both weights ≠ 1


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    return save_folder(tmp_path_factory.mktemp("tokenizer"), train_bpe(QWEN_SPECIALS), GENERATION_TEMPLATE,
                       eos_token="<|im_end|>", pad_token="<|endoftext|>")


@pytest.fixture(scope="module")
def kto(tokenizer_folder, tmp_path_factory):
    """TRL's KTOTrainer on the rows as one batch (its KL completions rotate within it), with a policy
    and a different reference; llmkit copies of both. Seeds chosen so that the policy's KL estimate
    is positive, where z₀ is not clipped to 0 and its value counts."""
    args = KTOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), report_to="none", use_cpu=True,
                     bf16=False, per_device_train_batch_size=len(ROWS), **SETTINGS)
    trainer = KTOTrainer(model=tiny_llama(0), ref_model=tiny_llama(1), args=args,
                         processing_class=transformers.AutoTokenizer.from_pretrained(tokenizer_folder),
                         train_dataset=Dataset.from_list(TRL_ROWS))
    return SimpleNamespace(trainer=trainer, policy=llmkit_copy(trainer.model),
                           reference=llmkit_copy(trainer.ref_model).requires_grad_(False))


# ---- the loss against TRL's -----------------------------------------------------------------------

class GivenLogps(torch.nn.Module):
    """Stands in for the model in TRL's KTO forward, whose fused LM head returns per-token log-probs
    [rows, T − 1], 0 where unlabelled: `completion` for the completions, `kl` for the mismatched pairs
    (told apart by their width)."""

    def __init__(self, completion, kl):
        super().__init__()
        self.completion, self.kl = completion, kl

    def forward(self, input_ids, **_):
        per_token = self.completion if input_ids.shape[1] - 1 == self.completion.shape[1] else self.kl
        zeros = torch.zeros_like(per_token.detach())
        return SimpleNamespace(log_probs=per_token, entropy=zeros, mean_logits=zeros, aux_loss=None)


def unpaired_logps(rows: int, width: int, kl_shift: float, seed: int = 0):
    """(per-token log-probs [B, T−1] of completions of 1..T−2 tokens ending each row, their mask
    [B, T]; the mismatched pairs' [B, T] and mask [B, T + 1]; reference log-probs of both [B]) with
    the policy's mismatched log-probs `kl_shift` above the reference's on average."""
    g = torch.Generator().manual_seed(seed)

    def completions(w):
        lengths = torch.randint(1, w - 1, (rows,), generator=g)
        mask = (torch.arange(w)[None] >= w - lengths[:, None]).long()
        return -3 * torch.rand(rows, w - 1, generator=g, dtype=torch.float64) * mask[:, 1:], mask

    per_token, mask = completions(width)
    kl_per_token, kl_mask = completions(width + 1)
    ref = per_token.sum(-1) + torch.randn(rows, generator=g, dtype=torch.float64)
    ref_kl = kl_per_token.sum(-1) - kl_shift + 0.5 * torch.randn(rows, generator=g, dtype=torch.float64)
    return per_token, mask, kl_per_token, kl_mask, ref, ref_kl


@pytest.mark.parametrize("labels, kl_shift", [
    ([True, False, True, True, False, False, True], 1.5),  # z₀ > 0
    ([True, False, True, True, False, False, True], -1.5),  # the estimate < 0: z₀ clipped to 0
    ([True] * 7, 0.8),  # no undesirable completion in the batch
], ids=["kl_positive", "kl_clipped", "desirable_only"])
def test_kto_loss_and_its_gradient_equal_trls_on_the_same_log_probs(kto, monkeypatch, labels, kl_shift):
    per_token, mask, kl_per_token, kl_mask, ref, ref_kl = unpaired_logps(len(labels), 9, kl_shift)
    desirable = torch.tensor(labels)
    for name, value in (("precompute_ref_logps", True), *SETTINGS.items()):
        monkeypatch.setattr(kto.trainer, name, value)
    leaf = per_token.clone().requires_grad_()
    inputs = {"input_ids": torch.ones_like(mask), "attention_mask": torch.ones_like(mask),
              "completion_mask": mask, "KL_input_ids": torch.ones_like(kl_mask),
              "KL_attention_mask": torch.ones_like(kl_mask), "KL_completion_mask": kl_mask,
              "label": desirable, "ref_logps": ref, "ref_KL_logps": ref_kl}
    theirs = kto.trainer.compute_loss(GivenLogps(leaf, kl_per_token), inputs)
    their_grad, = torch.autograd.grad(theirs, leaf)

    leaf = per_token.clone().requires_grad_()
    kl = kl_reference_point(kl_per_token.sum(-1), ref_kl)
    losses, _ = kto_loss(leaf.sum(-1), ref, desirable, kl, **SETTINGS)
    our_grad, = torch.autograd.grad(losses.mean(), leaf)

    assert (kl > 0) == (kl_shift > 0)
    assert kl.item() == pytest.approx(kto.trainer._metrics["train"]["kl"][-1], rel=1e-6)
    assert_close(losses.mean(), theirs)
    assert_close(our_grad, their_grad)
    assert their_grad.abs().sum() > 0


def llmkit_batch(tokenizer_folder) -> dict:
    """ROWS as `llmkit kto` encodes them, each paired for the KL estimate with the completion before it
    (TRL's rotation, here as the test fixes it), collated."""
    tokenizer = HFTokenizer(tokenizer_folder)
    items = [encode_feedback(tokenizer, row, 256) for row in ROWS]
    for i, item in enumerate(items):
        item.mismatched = mismatched_pair(item, items[i - 1], 256)
    return {k: torch.as_tensor(v) for k, v in collate_feedback(items, tokenizer.pad_id).items()}


def test_kto_task_equals_trls_kto_trainer_on_a_model_batch(kto, tokenizer_folder):
    """TRL's own tokenised, KL-paired and collated batch through its policy and reference, and
    llmkit's (encode_feedback, collate_feedback: the same ids, labels and mismatched pairs) through
    KtoTask on its copies (reference held, not precomputed): the same loss, z₀ and weight gradients."""
    batch = kto.trainer.data_collator([kto.trainer.train_dataset[i] for i in range(len(ROWS))])
    theirs = kto.trainer.compute_loss(kto.trainer.model, batch)
    their_kl = kto.trainer._metrics["train"]["kl"][-1]

    ours_batch = llmkit_batch(tokenizer_folder)
    assert torch.equal(ours_batch["input_ids"], batch["input_ids"])
    assert torch.equal(ours_batch["labels"] != IGNORE_INDEX, batch["completion_mask"].bool())
    assert torch.equal(ours_batch["kl_input_ids"], batch["KL_input_ids"])
    assert torch.equal(ours_batch["kl_labels"] != IGNORE_INDEX, batch["KL_completion_mask"].bool())
    assert torch.equal(ours_batch["desirable"].bool(), batch["label"])
    task = KtoTask(kto.policy, None, None, KtoConfig(precompute_ref=False, **SETTINGS),
                   reference=kto.reference)
    task.device = torch.device("cpu")
    ours, metrics = task.loss(kto.policy, ours_batch)

    assert their_kl > 0.01  # the KL estimate is in the loss, not clipped away
    assert metrics["kl"].item() == pytest.approx(their_kl, rel=1e-5)
    assert_close(ours, theirs)
    assert_same_weight_grads(ours, kto.policy, theirs, kto.trainer.model)


def test_each_mismatched_completion_answers_another_prompt(tok):
    """Rows unpaired from one pair sit side by side; TRL's rotation would pair such a prompt with its
    own other reply. Each item's mismatched pair is its own prompt then another prompt's completion."""
    rows = [{**r, "completion": c, "label": label} for r in separable_pairs(6)
            for c, label in ((r["chosen"], True), (r["rejected"], False))]
    items = [encode_feedback(tok, row, 64) for row in rows]
    mismatch_completions(items, 64, seed=0)
    completions = {tuple(f.example.input_ids[f.prompt_len:]): f for f in items}
    for item in items:
        prompt = item.mismatched.input_ids[:item.prompt_len]
        assert prompt == item.example.input_ids[:item.prompt_len]
        partner = completions[tuple(item.mismatched.input_ids[item.prompt_len:])]
        assert partner.example.input_ids[:partner.prompt_len] != prompt
        assert item.mismatched.labels[item.prompt_len:] == partner.example.labels[partner.prompt_len:]


# ---- ingest --kind feedback -----------------------------------------------------------------------

def test_ingest_reads_trls_unpaired_formats_and_unpairs_pairs(make_ctx, tmp_path):
    records = [
        {"id": "a", "prompt": "Q1", "completion": "A1", "label": True, "answer": "A1"},
        {"id": "b", "prompt": [{"role": "user", "content": "Q2"}],
         "completion": [{"role": "assistant", "content": "A2"}], "label": "false"},
        {"id": "c", "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q3"},
                                 {"role": "assistant", "content": "A3"}], "label": 1},
        {"id": "d", "prompt": "Q4", "chosen": "good", "rejected": "bad"},
        {"id": "g", "prompt": "Q7", "responses": ["best", "worse", "worst"]},
        {"id": "e", "prompt": "Q5", "completion": "A5", "label": "maybe"},
        {"id": "f", "prompt": "Q6", "completion": "A6"},
    ]
    ctx = make_ctx(force=True)
    b = run_ingest(ctx, [str(write_jsonl(tmp_path / "f.jsonl", records))], IngestConfig(kind="feedback"))
    kept = read_table(b.final).to_pylist()
    assert [(r["id"], r["prompt"], r["completion"], r["label"]) for r in kept] == [
        ("a", "Q1", "A1", True), ("b", "Q2", "A2", False), ("c", None, "A3", True),
        ("d-0", "Q4", "good", True), ("d-1", "Q4", "bad", False),
        ("g-0", "Q7", "best", True), ("g-1", "Q7", "worse", False), ("g-2", "Q7", "worst", False)]
    assert kept[0]["answer"] == "A1"
    assert [m["content"] for m in kept[2]["messages"]] == ["S", "Q3", "A3"]
    removed = read_table(b.final / "removed").to_pylist()
    assert [(r["id"], r["reason"]) for r in removed] == [("e", "invalid_label"), ("f", "missing_label")]


# ---- the stage --------------------------------------------------------------------------------------

def feedback_rows(n: int) -> list[dict]:
    """`separable_pairs` unpaired: the chosen number desirable, the rejected letters undesirable."""
    return [{"id": f"{r['id']}-{k}", "prompt": r["prompt"], "completion": c, "label": not k,
             "answer": r["answer"]} for r in separable_pairs(n) for k, c in enumerate((r["chosen"], r["rejected"]))]


@pytest.fixture
def ws(tmp_path, tok):
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "sft", tiny_model(tok.vocab_size), tok)
    write_dataset(ws, "feedback_train", feedback_rows(24))
    write_dataset(ws, "pref_train", separable_pairs(8))
    return ws


def run(make_ctx, ws, out="kto", **overrides):
    settings = dict(max_steps=6, micro_batch_size=8, lr=2e-2, min_lr=2e-3, warmup_steps=1, seq_len=64,
                    log_every=1, eval_every=0, eval_records=4, max_new_tokens=4)
    ctx = make_ctx(inputs=["feedback_train"], out=out)
    ctx.overrides = parse_overrides([f"{k}={v}" for k, v in {**settings, **overrides}.items()])
    b = run_kto(ctx, ctx.config(KtoConfig, "kto"), base="sft")
    return b, [json.loads(line) for line in (ws / out / "metrics.jsonl").open()]


def test_kto_starts_at_its_reference_and_widens_the_reward_margin(make_ctx, ws, tok):
    """At step 0 the policy is its reference: every reward and z₀ are 0 and each completion's loss
    is λ·(1 − σ(0)) = λ/2; training moves desirable rewards above undesirable ones."""
    b, records = run(make_ctx, ws, desirable_weight=1.0, undesirable_weight=1.0)
    assert records[0]["kl"] == 0.0 and records[0]["rewards/margins"] == 0.0
    assert records[0]["loss"] == pytest.approx(0.5, abs=1e-6)
    assert records[-1]["rewards/margins"] > 0.1 and records[-1]["loss"] < 0.5
    assert b.stats["desirable"] + b.stats["undesirable"] == b.stats["completions"]
    assert b.stats["eval_records"] > 0 and b.stats["accuracy"] is not None
    after, _ = load_model(ws / "kto")
    assert all(not torch.equal(p, q) for p, q in zip(tiny_model(tok.vocab_size).parameters(),
                                                      after.parameters()))


def test_lora_reference_is_the_base_precomputed_or_not(make_ctx, ws):
    """Under LoRA the reference is the policy with its adapters disabled: log-probs precomputed
    before training, or recomputed per batch, give the same run."""
    lora = {"lora.r": 4, "lora.alpha": 8, "max_steps": 3}
    _, precomputed = run(make_ctx, ws, out="kto-pre", **lora)
    _, held = run(make_ctx, ws, out="kto-held", precompute_ref="false", **lora)
    assert precomputed[0]["kl"] == 0.0 and precomputed[0]["loss"] == pytest.approx(0.5, abs=1e-6)
    for a, b in zip(precomputed, held):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
        assert a["kl"] == pytest.approx(b["kl"], rel=1e-4, abs=1e-6)


# ---- data of the other kind, and a reference under orpo/simpo ----------------------------------

def cli(ws, *args):
    return CliRunner().invoke(build_app(), [*args, "-w", str(ws)], catch_exceptions=False)


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_pairs_given_to_kto_and_feedback_given_to_dpo_exit_2_saying_how_to_convert(ws, dry_run):
    done = cli(ws, "kto", "--in", "pref_train", "--set", "seq_len=64", *dry_run)
    assert done.exit_code == 2
    assert "is preference data" in done.output and "reads feedback data" in done.output
    assert "llmkit ingest --kind feedback" in done.output
    done = cli(ws, "dpo", "--in", "feedback_train", "--set", "seq_len=64", *dry_run)
    assert done.exit_code == 2
    assert "is feedback data" in done.output and "reads preference data" in done.output
    assert "llmkit kto --in" in done.output
    assert not (ws / "kto").exists() and not (ws / "dpo").exists()


@pytest.mark.parametrize("loss_type", ["orpo", "simpo"])
def test_a_reference_under_orpo_or_simpo_is_refused_by_name_in_a_dry_run_too(ws, loss_type):
    for args in (["--ref", "sft"], ["--set", "precompute_ref=false"]):
        done = cli(ws, "dpo", "--dry-run", "--set", f"loss_type={loss_type}", *args)
        assert done.exit_code == 2
        assert ("--ref sft" if args[0] == "--ref" else "precompute_ref=false") in done.output
        assert f"loss_type={loss_type}" in done.output
