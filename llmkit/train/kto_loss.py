"""KTO's loss (Ethayarajh et al. 2024, eq. 7–8) as pure functions of sequence log-probabilities,
with the conventions of `llmkit.train.losses` (a completion's log-probability is the sum over its
labelled tokens). Kept apart from losses.py, which holds the paired and the online losses.

KTO scores each completion on its own — desirable or undesirable, no pair — against a reference
point z₀, an estimate of KL(π ‖ π_ref) taken from completions paired with prompts they do not
answer (mismatched pairs): a desirable reply must gain more than the policy drifts overall, an
undesirable one lose more. z₀ carries no gradient, as in the paper and TRL's KTOTrainer.
"""

from __future__ import annotations

import torch


def kl_reference_point(mismatched_logps: torch.Tensor, ref_mismatched_logps: torch.Tensor,
                       world_mean=None) -> torch.Tensor:
    """z₀ = max(0, mean(log π(y'|x) − log π_ref(y'|x))) over the mismatched pairs [B], detached;
    `world_mean` (a function of a 0-dim tensor) averages the per-process means first, as TRL's
    gather does, so every process uses the same z₀."""
    kl = (mismatched_logps - ref_mismatched_logps).mean().detach()
    if world_mean is not None:
        kl = world_mean(kl)
    return kl.clamp(min=0)


def kto_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor, desirable: torch.Tensor,
             kl: torch.Tensor | float, *, beta: float = 0.1, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-completion losses [B] and implicit rewards β·(log π − log π_ref) [B]:
    λ_D·(1 − σ(β·(r − z₀))) for a desirable completion, λ_U·(1 − σ(β·(z₀ − r))) for an
    undesirable one, r = log π(y|x) − log π_ref(y|x). Their mean is the batch's loss (TRL's)."""
    logratios = policy_logps - ref_logps
    desirable = desirable.bool()
    losses = torch.where(desirable,
                         desirable_weight * (1 - torch.sigmoid(beta * (logratios - kl))),
                         undesirable_weight * (1 - torch.sigmoid(beta * (kl - logratios))))
    return losses, beta * logratios.detach()
