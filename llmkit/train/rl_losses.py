"""The per-token maths of PPO / GRPO / RLOO as pure functions of tensors: the KL to the reference,
reward shaping, advantages, the clipped policy and value losses, log-probabilities of sampled tokens.

Per-token tensors are [B, R] over the response tokens of a rollout (R = longest response),
right-padded, with `mask` 1 on real response tokens (the stop token that ends a response
included) and 0 on padding. The preference losses and the masked statistics: `llmkit.train.losses`;
GRPO's loss variants and their aggregation: `llmkit.train.grpo_losses`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from llmkit.train.losses import masked_mean

REWARD_SCALINGS = ("group", "batch", "none")
RewardScaling = Literal["group", "batch", "none"]


# ---- KL to the reference ----------------------------------------------------------------------

KL_ESTIMATORS = ("k1", "k3")


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(π || π_ref) from tokens sampled from π (Schulman, "Approximating
    KL divergence"): k1 = log π − log π_ref (unbiased, can be negative); k3 = (ρ − 1) − log ρ with
    ρ = π_ref / π (unbiased, never negative, lower variance)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


class FixedKLController:
    """A constant KL coefficient β."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """β that steers the observed KL towards a target (Ziegler et al. 2019, sec. 2.2):
    e = clip(KL / target − 1, −0.2, 0.2); β ← β · (1 + e · n_steps / horizon)."""

    def __init__(self, kl_coef: float, target: float, horizon: int):
        self.value, self.target, self.horizon = kl_coef, target, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + error * n_steps / self.horizon


# ---- rewards -------------------------------------------------------------------------------------

def clip_scores(scores: torch.Tensor, clip: float | None) -> torch.Tensor:
    """Scores clamped to [−clip, clip]: one outlying reward-model score cannot dominate a batch."""
    return scores if clip is None else scores.clamp(-clip, clip)


def penalize_missing_stop(scores: torch.Tensor, stopped: torch.Tensor,
                          penalty: float | None) -> torch.Tensor:
    """Scores less `penalty` where `stopped` is False, i.e. the response ran out of tokens before
    its stop token (TRL's `missing_eos_penalty`): a reward model scores a cut-off reply as if it
    were finished, and the policy would learn to ramble to the budget."""
    return scores if penalty is None else scores - penalty * (~stopped.bool()).to(scores.dtype)


class RunningMoments:
    """Running mean and standard deviation of every score seen so far (Chan et al.'s parallel
    merge), to normalise rewards by statistics that do not jump from batch to batch."""

    def __init__(self):
        self.mean, self.var, self.count = 0.0, 1.0, 0

    def update(self, x: torch.Tensor) -> None:
        n = x.numel()
        if n == 0:
            return
        x = x.double()
        batch_mean, batch_var = x.mean().item(), x.var(unbiased=False).item()
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta ** 2 * self.count * n / total
        self.mean += delta * n / total
        self.var, self.count = m2 / total, total

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def normalize(self, x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
        return (x - self.mean) / (self.std + eps)

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]


def token_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor,
                  kl_coef: float) -> torch.Tensor:
    """Per-token rewards: −β·KL on every response token, plus the sequence's score on its last."""
    rewards = -kl_coef * kl * mask
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    return rewards.scatter_add(1, last[:, None], scores[:, None].to(rewards.dtype))


# ---- advantages ----------------------------------------------------------------------------------

def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016): advantages and returns [B, R].

    δ_t = r_t + γ·V_{t+1} − V_t and A_t = δ_t + γλ·A_{t+1}, with V = 0 after the last response
    token (the episode ends there). Returns are A + V, the value targets.
    """
    values = values * mask
    rewards = rewards * mask
    advantages = torch.zeros_like(rewards)
    next_advantage = torch.zeros_like(rewards[:, 0])
    next_value = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def group_relative_advantages(scores: torch.Tensor, group_size: int, scale: RewardScaling = "group",
                              eps: float = 1e-4) -> torch.Tensor:
    """GRPO (Shao et al. 2024): each score minus its group's mean, where a group is `group_size`
    consecutive samples of one prompt, divided by (TRL's `scale_rewards`)
    - group: the group's std (the paper);
    - batch: the std of every score given (more robust when a group's scores barely differ);
    - none: nothing (Dr. GRPO, Liu et al. 2025: dividing by the std weighs prompts that are too
      easy or too hard the most).
    A group whose samples all scored the same gives 0 — nothing to learn from it. A NaN score (a
    response no reward function scored) is left out of the means and stds and gets 0, as TRL's."""
    if scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    grouped = scores.view(-1, group_size)
    centred = grouped - grouped.nanmean(-1, keepdim=True)
    if scale == "none":
        return centred.view(-1).nan_to_num(nan=0.0)
    if scale == "group":
        std = nanstd(grouped, -1) if group_size > 1 else torch.ones_like(grouped[:, :1])
    elif scale == "batch":
        std = nanstd(scores) if scores.numel() > 1 else torch.ones_like(scores[0])
    else:
        raise ValueError(f"unknown scale_rewards {scale!r}; choose one of {REWARD_SCALINGS}")
    return (centred / (std + eps)).view(-1).nan_to_num(nan=0.0)


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The sample std (n − 1) of the values that are not NaN, along `dim` (kept) or of all; NaN
    where fewer than two are."""
    known = ~x.isnan()
    count = known.sum() if dim is None else known.sum(dim, keepdim=True)
    mean = x.nanmean() if dim is None else x.nanmean(dim, keepdim=True)
    squares = ((x - mean) ** 2).nan_to_num(nan=0.0)
    total = squares.sum() if dim is None else squares.sum(dim, keepdim=True)
    return torch.where(count > 1, total / (count - 1).clamp(min=1), torch.full_like(total, float("nan"))).sqrt()


def kl_penalized_scores(scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                        mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """RLOO's rewards [B] (Ahmadian et al. 2024, as TRL's RLOOTrainer): each score less β times
    its response's summed k1 estimate Σ_t (log π_old − log π_ref). The whole response is one
    action there, so its KL is one penalty on its reward, where ppo spreads it over the tokens'
    rewards and grpo adds it to the loss."""
    return scores - kl_coef * ((logprobs - ref_logprobs) * mask).sum(-1)


def leave_one_out_advantages(rewards: torch.Tensor, group_size: int, normalize: bool = False,
                             eps: float = 1e-4) -> torch.Tensor:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): each reward minus the mean of the other
    group_size − 1 rewards of its group (consecutive samples of one prompt). The baseline leaves
    the sample itself out, so it does not depend on the action it judges and the gradient
    estimate stays unbiased (a group mean including it shrinks every advantage by (k − 1) / k).
    A NaN reward marks a response nothing could score: baselines average only the scorable
    siblings, and an unscorable response, or the one scorable response of its group, gets 0
    (TRL's). `normalize` (TRL's normalize_advantages): then zero mean and unit std over every
    scorable advantage given, std + eps."""
    if group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size} >= 2")
    grouped = rewards.view(-1, group_size)
    scorable = (~grouped.isnan()).sum(-1, keepdim=True)
    baselines = (grouped.nansum(-1, keepdim=True) - grouped) / (scorable - 1)
    advantages = (grouped - baselines).view(-1)
    if normalize:
        known = advantages[~advantages.isnan()]
        std = known.std() if known.numel() > 1 else known.new_tensor(float("nan"))
        advantages = (advantages - known.mean()) / (std + eps)
    return advantages.nan_to_num(nan=0.0)


# ---- losses --------------------------------------------------------------------------------------

def clipped_policy_token_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                              advantages: torch.Tensor, clip_range: float,
                              clip_range_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate (Schulman et al. 2017, eq. 7) per token, negated to minimise:
    max(−A·ρ, −A·clip(ρ, 1−ε, 1+ε_high)), ρ = π / π_old; and where the clip was active (bool).
    ε_high (DAPO's clip-higher, TRL's epsilon_high) defaults to ε."""
    high = clip_range if clip_range_high is None else clip_range_high
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_range, 1 + high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def clipped_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                        advantages: torch.Tensor, mask: torch.Tensor,
                        clip_range: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`clipped_policy_token_loss` averaged over the tokens, and the fraction of tokens where the
    clip was active."""
    per_token, was_clipped = clipped_policy_token_loss(logprobs, old_logprobs, advantages, clip_range)
    return masked_mean(per_token, mask), masked_mean(was_clipped.float(), mask).detach()


def sequence_clipped_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                                 advantages: torch.Tensor, mask: torch.Tensor, clip_range: float,
                                 clip_range_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO's policy loss as TRL's RLOOTrainer forms it: PPO's clipped surrogate on one ratio per
    response, π(y) / π_old(y) of its whole log-probability (the response is one action, as its
    advantage [B] is), averaged over the responses; and where the clip was active [B]."""
    def of_response(per_token):
        return (per_token * mask).sum(-1)

    per_response, was_clipped = clipped_policy_token_loss(
        of_response(logprobs), of_response(old_logprobs), advantages, clip_range, clip_range_high)
    return per_response.mean(), was_clipped


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor, clip_range: float) -> tuple[torch.Tensor, torch.Tensor]:
    """½·mean of max((V − R)², (V_clip − R)²), V_clip = V_old + clip(V − V_old, −ε, ε): the value
    may not move far from the rollout's estimate in one batch either. Also the clip fraction."""
    clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
    unclipped_err = (values - returns) ** 2
    clipped_err = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped_err, clipped_err), mask)
    clipfrac = masked_mean((clipped_err > unclipped_err).float(), mask)
    return loss, clipfrac.detach()


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax of logits [..., V] along the last axis: logsumexp(l) − Σ p·l."""
    logits = logits.float()
    return torch.logsumexp(logits, -1) - (logits.softmax(-1) * logits).sum(-1)


def logprobs_of(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] for each position: logits [B, R, V], tokens [B, R] -> [B, R]."""
    logits = logits.float()
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def at_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits if temperature == 1.0 else logits / temperature  # x / 1 is x: no pass over [N, R, V]


def logprobs_and_entropy(logits: torch.Tensor, tokens: torch.Tensor, with_entropy_grad: bool):
    """(`logprobs_of(logits, tokens)`, `entropy_from_logits(logits)`) [N, R] each, sharing one
    logsumexp over the vocabulary; the entropy detached unless `with_entropy_grad`."""
    logits = logits.float()
    normalizer = logits.logsumexp(-1)
    logprobs = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - normalizer
    values = logits if with_entropy_grad else logits.detach()
    entropy = (normalizer if with_entropy_grad else normalizer.detach()) - (values.softmax(-1) * values).sum(-1)
    return logprobs, entropy
