"""The losses of the training stages (reward model, DPO and its variants, ORPO, SimPO) and the
masked statistics every per-token loss shares, as pure functions of tensors. The per-token maths
of PPO / GRPO / RLOO: `llmkit.train.rl_losses`.

Conventions shared by every function here:
- `labels` are aligned with `input_ids` (Hugging Face style): `labels[t]` is the token at
  position t when it is trained on, `IGNORE_INDEX` otherwise; the shift by one (logits at t
  predict the token at t + 1) happens inside `token_logps`. (The language-model loss itself,
  `llmkit.model.cross_entropy.chunked_cross_entropy`, sits beside the model and takes `targets`
  instead, already shifted, as pretraining batches hold them.)
- A sequence's log-probability is the sum over its labelled tokens (TRL's convention for DPO);
  `average=True` divides by their number (IPO, as its authors specify).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

from llmkit.model.cross_entropy import IGNORE_INDEX

DPO_LOSS_TYPES = ("sigmoid", "ipo", "cdpo", "robust", "reference_free")
DpoLossType = Literal["sigmoid", "ipo", "cdpo", "robust", "reference_free"]
# the preference losses that hold no reference model at all: ORPO and SimPO (`orpo_loss`, `simpo_loss`)
NO_REFERENCE_LOSS_TYPES = ("orpo", "simpo")
PreferenceLossType = Literal["sigmoid", "ipo", "cdpo", "robust", "reference_free", "orpo", "simpo"]


def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(label_{t+1} | ..t) for each position, and the mask of labelled positions; [B, T-1]."""
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    logits = logits[:, :-1].float()
    safe_targets = targets.masked_fill(~mask, 0).unsqueeze(-1)
    # log_softmax(x)[y] = x[y] - logsumexp(x): avoids materialising the [B, T, V] log-softmax
    picked = logits.gather(-1, safe_targets).squeeze(-1) - logits.logsumexp(-1)
    return picked * mask, mask


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


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − eˣ) for x ≤ 0; log1p(−eˣ) loses everything to cancellation near 0 and log(−expm1(x))
    far below it, so it branches at −ln 2 (Mächler 2012, as TRL's ORPOTrainer)."""
    return torch.where(x < -math.log(2), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, *,
              lam: float = 0.1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ORPO's odds-ratio term per pair (Hong et al. 2024, eq. 6–7) and the rewards λ·log π of chosen
    and rejected, from average per-token log-probs [B]: −λ·log σ(log(odds_c / odds_r)), where
    odds(y) = P(y) / (1 − P(y)) and P(y) = exp(mean log-prob). The whole ORPO loss is the chosen
    replies' NLL plus the mean of these: the SFT term keeps the chosen reply likely, this one
    pushes the rejected one below it, and no reference model is needed."""
    chosen, rejected = policy_chosen.float(), policy_rejected.float()
    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
    losses = -lam * F.logsigmoid(log_odds)
    return losses, lam * chosen.detach(), lam * rejected.detach()


def simpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, *, beta: float = 2.0,
               gamma: float = 0.5,
               label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SimPO per pair (Meng et al. 2024, eq. 6) and its rewards β·log π of chosen and rejected, from
    average per-token log-probs [B]: −log σ(β·(log π_c − log π_r) − γ), the reward being the
    length-normalised log-prob itself (no reference) and γ a target margin; with label_smoothing ε
    the conservative form, −(1−ε)·log σ(z) − ε·log σ(−z), as TRL's CPOTrainer writes it."""
    z = beta * (policy_chosen - policy_rejected) - gamma
    losses = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    return losses, beta * policy_chosen.detach(), beta * policy_rejected.detach()


# ---- masked statistics ----------------------------------------------------------------------

def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over the positions where mask is 1 (over all of them, or along `dim`)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased variance of x over the positions where mask is 1."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    return masked_mean((x - mean) ** 2, mask) * n / (n - 1).clamp(min=1)


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
           eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked positions; padding stays 0. Without shift_mean the mean
    is kept (rescaling only), as for rewards whose sign carries meaning."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask
