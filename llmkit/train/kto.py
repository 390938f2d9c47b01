"""Kahneman–Tversky optimisation (`llmkit kto`, Ethayarajh et al. 2024): train a policy on unpaired
feedback — completions labelled desirable or undesirable, what a product logs as thumbs up and
down — against a frozen reference, as TRL's KTOTrainer (loss equal to it to 1e-5,
tests/train/test_kto.py).

Each completion's reward is β·(log π − log π_ref) of its reply tokens (summed, as DPO's); the loss
is `kto_loss` against the reference point z₀, the policy's KL from the reference estimated on
mismatched pairs: each prompt followed by another prompt's completion (`mismatch_completions`;
TRL rotates the completions within a batch, which needs its data in order; llmkit fixes each
row's partner once, from a seeded shuffle, so that length-bucketed batches keep it). z₀ is the
mean over the batch (over the processes' batches under several) clipped at 0, without gradient.

The reference is `--ref`, by default the starting checkpoint `--from`; under LoRA the policy itself
with its adapters disabled. Its log-probs of both sequences are computed once before training
(`precompute_ref=false` keeps it and recomputes them per batch), as in `llmkit dpo`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from llmkit.data.chat import fixed_batches, one_per_prompt
from llmkit.data.preferences import collate_feedback, encode_feedbacks, require_dataset_kind
from llmkit.errors import ConfigError
from llmkit.train.dpo import completion_logps, plan_dpo, reference_output, reference_policy, reference_run
from llmkit.train.kto_loss import kl_reference_point, kto_loss
from llmkit.train.losses import masked_mean
from llmkit.train.posttrain import (GenerativeConfig, batch_stream, exact_match_scorer,
                                    exact_match_summary, heldout_split, load_start,
                                    post_training_inputs)
from llmkit.train.rollouts import rank_and_world, summed_over_processes
from llmkit.train.stage import Fit, fit_stage
from llmkit.train.task import Task, to_device


@dataclass
class KtoConfig(GenerativeConfig):
    micro_batch_size: int = 8  # completions per forward (their mismatched pairs go through too)
    lr: float = 1e-5  # KTO moves a tuned policy a little (TRL's 1e-6); tiny models take more
    min_lr: float = 1e-6  # learning rate at the end of the cosine decay
    beta: float = 0.1  # β: the scale of the implicit reward, the strength of the pull to the reference
    desirable_weight: float = 1.0  # λ_D: weight of a desirable completion's loss (the paper: keep
    #                                λ_D·n_D / (λ_U·n_U) in [1, 4/3] when the labels are unbalanced)
    undesirable_weight: float = 1.0  # λ_U: weight of an undesirable completion's loss
    precompute_ref: bool = True  # reference log-probs in one pass before training (frees it)

    def __post_init__(self):
        super().__post_init__()
        if not self.beta > 0:
            raise ConfigError(f"beta must be > 0, got {self.beta}")
        for key in ("desirable_weight", "undesirable_weight"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key} must be > 0, got {getattr(self, key)}")

    @property
    def uses_reference(self) -> bool:
        """KTO always scores against a reference (the helpers of llmkit.train.dpo ask)."""
        return True


def mismatched(batch: dict) -> dict:
    """The batch's mismatched pairs as a batch of their own."""
    return {"input_ids": batch["kl_input_ids"], "labels": batch["kl_labels"]}


@torch.no_grad()
def precompute_reference_logps(reference, items: list, pad_id: int, batch_size: int) -> None:
    """Give each feedback item its reference (completion, mismatched pair) log-probs, in one pass."""
    device = next(reference.parameters()).device
    was_training = reference.training
    reference.eval()
    order = sorted(range(len(items)), key=lambda i: len(items[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        batch = to_device(collate_feedback([items[i] for i in chunk], pad_id), device)
        pairs = zip(completion_logps(reference, batch).tolist(),
                    completion_logps(reference, mismatched(batch)).tolist())
        for i, logps in zip(chunk, pairs):
            items[i].ref_logps = logps
    reference.train(was_training)


def mean_over_processes(x: torch.Tensor) -> torch.Tensor:
    return summed_over_processes(x) / rank_and_world()[1]


class KtoTask(Task):
    """KTO's loss of each completion's log-prob against the reference's, and z₀."""

    perplexity = False  # a preference loss: exp(val_loss) is no perplexity

    def __init__(self, model, train_data, eval_data, cfg: KtoConfig, reference=None,
                 reference_seconds: float = 0.0):
        super().__init__(model, train_data, eval_data)
        self.cfg = cfg
        self.reference = reference  # held only when not precomputed; None: the policy's own base
        self.reference_seconds = reference_seconds

    def reference_logps(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference's (completion, mismatched pair) log-probs [B] each."""
        if "ref_logps" in batch:
            return batch["ref_logps"], batch["ref_kl_logps"]
        return reference_output(self.reference, model, self.device, lambda m: (
            completion_logps(m, batch), completion_logps(m, mismatched(batch))))

    def loss(self, model, batch):
        cfg = self.cfg
        with torch.no_grad():
            mismatched_logps = completion_logps(model, mismatched(batch))
        policy = completion_logps(model, batch)
        ref, ref_mismatched = self.reference_logps(model, batch)
        kl = kl_reference_point(mismatched_logps, ref_mismatched, mean_over_processes)
        desirable = batch["desirable"].bool()
        losses, rewards = kto_loss(policy, ref, desirable, kl, beta=cfg.beta,
                                   desirable_weight=cfg.desirable_weight,
                                   undesirable_weight=cfg.undesirable_weight)
        chosen, rejected = masked_mean(rewards, desirable), masked_mean(rewards, ~desirable)
        metrics = {"kl": kl, "rewards/chosen": chosen, "rewards/rejected": rejected,
                   "rewards/margins": chosen - rejected,
                   "logps/chosen": masked_mean(policy.detach(), desirable),
                   "logps/rejected": masked_mean(policy.detach(), ~desirable)}
        return losses.mean() + model.aux_loss, metrics

    def flops_per_token(self) -> float:
        return self.model.flops_per_token(self.cfg.seq_len)


@dataclass
class FeedbackData:
    """A feedback dataset read, split and encoded; `scored`: the held-out rows scored by exact
    match (a desirable completion per prompt is the answer, unless the row has an `answer`)."""

    items: list
    eval_items: list
    scored: list[dict]
    stats: dict


def feedback_data(tokenizer, data_art, eval_art, cfg: KtoConfig) -> FeedbackData:
    train_rows, heldout = heldout_split(data_art, eval_art, cfg, ("completion", "label"))
    items, counts = encode_feedbacks(tokenizer, train_rows, cfg.seq_len, cfg.seed)
    eval_items, _ = encode_feedbacks(tokenizer, heldout, cfg.seq_len, cfg.seed)
    scored = one_per_prompt([{**r, "response": r["completion"]} for r in heldout if r["label"]])
    scored = scored[:cfg.eval_records]
    return FeedbackData(items, eval_items, scored, {**counts, "train_rows": len(train_rows),
                                                    "heldout_completions": len(eval_items),
                                                    "eval_records": len(scored)})


def kto_task(policy, ref_step, data: FeedbackData, cfg: KtoConfig, pad_id: int, dist) -> KtoTask:
    """The task of a run: its reference made ready, its batches sharded for this process."""
    collate = partial(collate_feedback, pad_id=pad_id)
    reference, seconds = reference_policy(
        policy, ref_step, cfg, dist.device,
        lambda ref: precompute_reference_logps(ref, data.items + data.eval_items, pad_id,
                                               cfg.micro_batch_size))
    eval_batches = fixed_batches(data.eval_items, collate, cfg.micro_batch_size)
    return KtoTask(policy, batch_stream(data.items, collate, cfg, dist), eval_batches or None, cfg,
                   reference, seconds)


def kto_summary(stats: dict) -> list[tuple]:
    return [("final loss", stats["final_loss"]), ("KL estimate z0", stats["kl"]),
            ("reward margin", stats["reward_margin"]), *exact_match_summary(stats)]


KTO_METRICS = {"final_loss": "loss", "kl": "kl", "reward_margin": "rewards/margins"}


def run_kto(ctx, cfg: KtoConfig, base: str, ref: str | None = None, eval_data: str | None = None):
    """`llmkit kto`: train checkpoint `base` on the labelled completions of --in (default
    feedback_train) against reference `ref` (default: `base`)."""
    base_art, base_step, data_art, eval_art = post_training_inputs(ctx, "kto", cfg, base, eval_data)
    require_dataset_kind([data_art, eval_art], "feedback", "kto")
    ref_art, ref_step = reference_run(ctx, cfg, ref, base_step)

    def prepare() -> Fit:
        policy, tokenizer = load_start(base_step, cfg)
        data = feedback_data(tokenizer, data_art, eval_art, cfg)
        return Fit(lambda dist: kto_task(policy, ref_step, data, cfg, tokenizer.pad_id, dist),
                   tokenizer.path, kto_summary, model=policy, start=base_step, metrics=KTO_METRICS,
                   after=lambda _, task: {"reference_seconds": round(task.reference_seconds, 2)},
                   score=exact_match_scorer(cfg, tokenizer, data.scored), stats=data.stats)

    return fit_stage(ctx, "kto", cfg, [base_art, ref_art, data_art, eval_art], prepare)


def plan_kto(ctx, cfg, base: str, ref: str | None, eval_data: str | None) -> None:
    """`llmkit kto --dry-run`: dpo's plan, for labelled completions."""
    plan_dpo(ctx, cfg, base, ref, eval_data, stage="kto")
