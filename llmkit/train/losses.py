"""The losses of the training stages, as pure functions of tensors.

Conventions shared by every function here:
- `labels` are aligned with `input_ids` (Hugging Face style): `labels[t]` is the token at
  position t when it is trained on, `IGNORE_INDEX` otherwise; the shift by one (logits at t
  predict the token at t + 1) happens inside `token_logps`. `chunked_cross_entropy` takes
  `targets` instead, already shifted, as pretraining batches hold them.
- A sequence's log-probability is the sum over its labelled tokens (TRL's convention for DPO);
  `average=True` divides by their number (IPO, as its authors specify).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100
DPO_LOSS_TYPES = ("sigmoid", "ipo", "cdpo", "robust", "reference_free")
DpoLossType = Literal["sigmoid", "ipo", "cdpo", "robust", "reference_free"]


def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(label_{t+1} | ..t) for each position, and the mask of labelled positions; [B, T-1]."""
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    logits = logits[:, :-1].float()
    safe_targets = targets.masked_fill(~mask, 0).unsqueeze(-1)
    # log_softmax(x)[y] = x[y] - logsumexp(x): avoids materialising the [B, T, V] log-softmax
    picked = logits.gather(-1, safe_targets).squeeze(-1) - logits.logsumexp(-1)
    return picked * mask, mask


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor, average: bool = False) -> torch.Tensor:
    """Sum (or mean, with `average`) of the labelled tokens' log-probabilities, per row: [B]."""
    logps, mask = token_logps(logits, labels)
    total = logps.sum(-1)
    return total / mask.sum(-1).clamp(min=1) if average else total


def chunked_cross_entropy(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                          label_smoothing: float = 0.0, chunk_size: int = 1024) -> torch.Tensor:
    """`F.cross_entropy(head(hidden).float(), targets, ignore_index=IGNORE_INDEX, label_smoothing=...)`
    without ever holding every position's logits; 0 when no target is labelled.

    `targets[..., t]` is the token that position t predicts (already shifted, unlike `labels`).
    Logits are made chunk_size labelled positions at a time and reduced to a loss sum; backward
    makes each chunk's logits again (torch.utils.checkpoint), so at most one chunk's exist at once.
    `head` is the module, not its weight: ZeRO-3 gathers a module's parameters in its forward
    hooks, which fire for the recomputation too.
    """
    labelled = targets != IGNORE_INDEX
    hidden, targets = hidden[labelled], targets[labelled]
    if not len(targets):
        return hidden.float().sum()  # a zero that still backpropagates (engines call backward on it)
    total = 0.0
    for h, t in zip(hidden.split(chunk_size), targets.split(chunk_size)):
        if torch.is_grad_enabled():
            total = total + checkpoint(_loss_sum, head, h, t, label_smoothing, use_reentrant=False)
        else:
            total = total + _loss_sum(head, h, t, label_smoothing)
    return total / len(targets)


def _loss_sum(head, hidden, targets, label_smoothing):
    return F.cross_entropy(head(hidden).float(), targets, reduction="sum", label_smoothing=label_smoothing)


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the labelled (assistant) tokens of the whole batch."""
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(),
                           ignore_index=IGNORE_INDEX)


def bradley_terry_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor,
                       margin: torch.Tensor | float | None = None,
                       center_coef: float = 0.0) -> torch.Tensor:
    """-log σ(r_c - r_r - margin), averaged, plus center_coef · mean((r_c + r_r)²).

    The centring term (Eisenstein et al. 2023; TRL's `center_rewards_coefficient`) keeps rewards
    near zero mean, which only their differences otherwise leave undetermined.
    """
    diff = chosen_rewards - rejected_rewards
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_coef:
        loss = loss + center_coef * ((chosen_rewards + rejected_rewards) ** 2).mean()
    return loss


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
             ref_chosen: torch.Tensor | None, ref_rejected: torch.Tensor | None, *,
             beta: float = 0.1, loss_type: DpoLossType = "sigmoid",
             label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair losses [B] and the implicit rewards β·(log π − log π_ref) of chosen and rejected.

    Inputs are sequence log-probabilities [B] of the completions (averaged per token for IPO).
    - sigmoid (DPO, Rafailov et al. eq. 7): −log σ(β·h), h = (π_c − π_r) − (ref_c − ref_r);
      with label_smoothing ε it is the conservative cDPO (−(1−ε)·log σ(βh) − ε·log σ(−βh));
    - cdpo: the same with ε required > 0;
    - robust (Chowdhury et al. 2024): ((1−ε)·(−log σ(βh)) + ε·log σ(−βh)) / (1 − 2ε);
    - ipo (Azar et al. 2023): (h − 1/(2β))²;
    - reference_free: sigmoid with a uniform reference (ref log-probs taken as 0).
    """
    if loss_type == "reference_free" or ref_chosen is None:
        ref_chosen = torch.zeros_like(policy_chosen)
        ref_rejected = torch.zeros_like(policy_rejected)
    chosen_logratio = policy_chosen - ref_chosen
    rejected_logratio = policy_rejected - ref_rejected
    h = chosen_logratio - rejected_logratio
    eps = label_smoothing
    if loss_type in ("sigmoid", "cdpo", "reference_free"):
        losses = -(1 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)
    elif loss_type == "robust":
        losses = (-(1 - eps) * F.logsigmoid(beta * h) + eps * F.logsigmoid(-beta * h)) / (1 - 2 * eps)
    elif loss_type == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; choose one of {DPO_LOSS_TYPES}")
    return losses, beta * chosen_logratio.detach(), beta * rejected_logratio.detach()
