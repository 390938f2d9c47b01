"""GRPO's policy losses as TRL 1.16's GRPOTrainer forms them (`loss_type`, `importance_sampling_level`):
the per-token loss of each variant and how a micro-batch's per-token losses become one.

Per-token tensors are [B, R] over the response tokens (right-padded, `mask` 1 on real ones);
advantages are [B, 1] or [B, R] (one value per response, broadcast). ρ = π / π_old is the
importance weight: per token, or with importance_sampling_level=sequence (GSPO, Zheng et al.
2025) one per response, exp of the mean of its tokens' log-ratios, [B, 1].

- grpo, bnpo, dr_grpo, dapo, luspo: PPO's clipped surrogate max(−A·ρ, −A·clip(ρ, 1−ε, 1+ε_high)),
  ρ first capped at `ratio_max` (INTELLECT-2's two-sided clip, TRL's delta) when one is given;
- cispo (MiniMax-M1): −sg(min(ρ, ε_high))·A·log π — the weight clipped and detached, so every
  token keeps a REINFORCE gradient (TRL clips at ε_high itself, not 1 + ε_high);
- sapo (Gao et al. 2025): −A · 4/τ · σ(τ(ρ − 1)), τ = τ_pos where A > 0 else τ_neg: a soft gate
  in place of the hard clip (its gradient at ρ = 1 is A, as the surrogate's);
- vespo: −sg(φ(w))·A·log π with w the response's ratio Π_t ρ_t and φ(w) = e^λ·w^k·e^(−λw)
  (k, λ by the sign of A): a smooth, asymmetric weight on whole responses.

The losses are pure functions: `llmkit.train.ppo_algorithms` feeds them a minibatch; their
parity with TRL's `_compute_loss` is tests/train/test_grpo_losses.py.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
GrpoLossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
ImportanceSamplingLevel = Literal["token", "sequence"]
# the losses normalised by the response tokens of the whole optimizer step (TRL's num_items_in_batch)
STEP_TOKEN_LOSSES = ("dapo", "cispo", "vespo")
CLIPPED_SURROGATE_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


def log_importance_weights(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor,
                           level: ImportanceSamplingLevel = "token") -> torch.Tensor:
    """log ρ: per token [B, R], or (sequence, GSPO) each response's mean token log-ratio [B, 1]."""
    log_ratio = logprobs - old_logprobs
    if level == "token":
        return log_ratio
    if level == "sequence":
        mask = mask.to(log_ratio.dtype)
        return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    raise ValueError(f"unknown importance_sampling_level {level!r}; choose one of {IMPORTANCE_SAMPLING_LEVELS}")


@torch.no_grad()
def vespo_weights(advantages: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor,
                  k_pos: float = 2.0, lambda_pos: float = 3.0, k_neg: float = 3.0,
                  lambda_neg: float = 2.0) -> torch.Tensor:
    """VESPO's φ(w) = exp(λ + k·log w − λ·w) of each response's ratio w = exp Σ_t log ρ_t (the sum
    and log w clamped to [log 1e-8, 20], each log ρ_t to ±20, as TRL), with k, λ of A ≥ 0 or A < 0;
    no gradient: it only scales the REINFORCE term."""
    low = math.log(1e-8)
    log_w = (log_ratio.clamp(-20.0, 20.0) * mask).sum(-1, keepdim=True).clamp(low, 20.0)
    nonneg = advantages >= 0
    k = torch.where(nonneg, k_pos, k_neg)
    lam = torch.where(nonneg, lambda_pos, lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def grpo_token_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, loss_type: GrpoLossType = "dapo", *,
                    level: ImportanceSamplingLevel = "token", clip_range: float = 0.2,
                    clip_range_high: float | None = None, ratio_max: float | None = None,
                    sapo_temperatures: tuple[float, float] = (1.0, 1.05),
                    vespo: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0),
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(per-token loss [B, R] or [B, 1], the importance weight ρ [B, R] or [B, 1], where the
    weight was clipped — None for sapo and vespo, which do not clip) of `loss_type` (module
    docstring). ε_high defaults to ε; sapo_temperatures = (τ_pos, τ_neg); vespo = (k_pos,
    λ_pos, k_neg, λ_neg) — TRL's defaults."""
    high = clip_range if clip_range_high is None else clip_range_high
    ratio = torch.exp(log_importance_weights(logprobs, old_logprobs, mask, level))
    if loss_type == "cispo":
        return (-ratio.clamp(max=high).detach() * advantages * logprobs, ratio,
                (ratio > high) & (advantages > 0))
    if loss_type in CLIPPED_SURROGATE_LOSSES:
        clipped = ratio.clamp(1 - clip_range, 1 + high)
        capped = ratio if ratio_max is None else ratio.clamp(max=ratio_max)
        unclipped_loss, clipped_loss = -capped * advantages, -clipped * advantages
        return torch.maximum(unclipped_loss, clipped_loss), ratio, clipped_loss > unclipped_loss
    if loss_type == "sapo":
        tau_pos, tau_neg = sapo_temperatures
        tau = torch.where(advantages > 0, tau_pos, tau_neg)
        return -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * advantages, ratio, None
    if loss_type == "vespo":
        phi = vespo_weights(advantages, logprobs - old_logprobs, mask, *vespo)
        return -phi * advantages * logprobs, ratio, None
    raise ValueError(f"unknown GRPO loss_type {loss_type!r}; choose one of {GRPO_LOSS_TYPES}")


def aggregate_token_loss(per_token: torch.Tensor, mask: torch.Tensor, loss_type: GrpoLossType, *,
                         max_tokens: int | None = None,
                         tokens_per_micro_batch: torch.Tensor | float | None = None) -> torch.Tensor:
    """One micro-batch's loss from its per-token losses [B, R] (or [B, 1], broadcast over each
    response's tokens), as TRL's GRPOTrainer forms it (`loss_type`); the engine then averages the
    micro-batches of a step over accumulation and processes:
    - grpo, sapo: the mean over sequences of each sequence's token mean (Shao et al. 2024, eq. 3);
      a token of a short response weighs more than one of a long response;
    - bnpo: the mean over every token of the micro-batch;
    - dr_grpo: the token sum / (sequences × max_tokens, the generation budget) (Liu et al. 2025,
      "Dr. GRPO"): no length bias, and a constant normaliser;
    - dapo, cispo, vespo: the token sum / `tokens_per_micro_batch` (Yu et al. 2025, DAPO): given the
      response tokens of the whole optimizer step, over every micro-batch and process, divided by
      the number of those micro-batches, the engine's mean over them is the mean over every token
      of the step (TRL's `num_items_in_batch`): each token weighs the same however the step's
      sequences were split into micro-batches;
    - luspo: the mean over sequences of each sequence's token sum (LUSPO: a response weighs by
      its length, undoing GSPO's length normalisation).
    """
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    if loss_type in ("grpo", "sapo"):
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        if max_tokens is None:
            raise ValueError("loss_type dr_grpo divides by sequences × max_tokens: give max_tokens")
        return masked.sum() / (masked.shape[0] * max_tokens)
    if loss_type in STEP_TOKEN_LOSSES:
        if tokens_per_micro_batch is None:
            raise ValueError(f"loss_type {loss_type} divides by the step's tokens: give tokens_per_micro_batch")
        total = masked.sum()
        return total / torch.as_tensor(tokens_per_micro_batch, dtype=total.dtype,
                                       device=total.device).clamp(min=1)
    if loss_type == "luspo":
        return masked.sum(-1).mean()
    raise ValueError(f"unknown GRPO loss_type {loss_type!r}; choose one of {GRPO_LOSS_TYPES}")
