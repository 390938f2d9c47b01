"""What PPO, GRPO and RLOO do differently, given a scored rollout: the advantages each makes of
the scores and the loss each minimises over a minibatch. `llmkit.train.ppo`'s task samples, scores,
serves minibatches and resumes alike for the three; the per-token maths are `train.rl_losses`.
"""

from __future__ import annotations

import functools

import torch

from llmkit.train.losses import masked_mean, whiten
from llmkit.train.ppo_config import PpoConfig
from llmkit.train.grpo_losses import STEP_TOKEN_LOSSES, aggregate_token_loss, grpo_token_loss
from llmkit.train.rl_losses import (clipped_policy_token_loss, clipped_value_loss, gae,
                                    group_relative_advantages, kl_estimate, kl_penalized_scores,
                                    leave_one_out_advantages, sequence_clipped_policy_loss, token_rewards)
from llmkit.train.rollouts import over_processes
from llmkit.train.task import ITEMS_PER_MICRO_BATCH


def add_advantages(rollout: dict, cfg: PpoConfig, scores, stopped, logprobs, ref_logprobs, values,
                   kl_coef: float) -> torch.Tensor:
    """`rollout["advantages"]` from the rollout's scores (and ppo's values and returns; truncated
    responses masked out where `mask_truncated_completions` says). Returns the response mask the
    rollout's metrics read: RLOO's without the truncated responses, the sampled one otherwise."""
    mask = rollout["response_mask"]
    if cfg.algo == "ppo":
        unscorable = scores.isnan()  # no reward judged it: out of the loss (GAE cannot carry a NaN)
        if unscorable.any():
            mask = rollout["response_mask"] = mask * (~unscorable)[:, None].to(mask.dtype)
            scores = scores.nan_to_num(0.0)
        kl = (kl_estimate(logprobs, ref_logprobs, cfg.kl_estimator) if ref_logprobs is not None
              else torch.zeros_like(logprobs))
        rewards = token_rewards(scores, kl, mask, kl_coef)
        advantages, returns = gae(rewards, values, mask, cfg.gamma, cfg.lam)
        if cfg.whiten_advantages:
            advantages = whiten(advantages, mask)
        rollout.update(values=values, returns=returns)
    elif cfg.algo == "grpo":
        advantages = group_advantages(cfg, scores)[:, None] * mask
        if cfg.mask_truncated_completions:  # still scored within their group, not trained on
            rollout["response_mask"] = mask * stopped[:, None].to(mask.dtype)
    else:
        if cfg.mask_truncated_completions:  # as TRL's: scored, but out of the KL and the loss
            mask = rollout["response_mask"] = mask * stopped[:, None].to(mask.dtype)
        rewards = (kl_penalized_scores(scores, logprobs, ref_logprobs, mask, kl_coef)
                   if ref_logprobs is not None else scores)
        advantages = group_advantages(cfg, rewards)[:, None]  # one per response: [N, 1]
    rollout["advantages"] = advantages
    return mask


def group_advantages(cfg: PpoConfig, rewards: torch.Tensor) -> torch.Tensor:
    """GRPO's or RLOO's advantages of this process's samples. Groups never straddle processes,
    but scale_rewards=batch and normalize_advantages use every process's, as TRL does."""
    if cfg.algo == "rloo":
        return over_processes(functools.partial(
            leave_one_out_advantages, group_size=cfg.group_size, normalize=cfg.normalize_advantages),
            rewards, pooled=cfg.normalize_advantages)
    return over_processes(functools.partial(
        group_relative_advantages, group_size=cfg.group_size, scale=cfg.scale_rewards),
        rewards, pooled=cfg.scale_rewards == "batch")


def algorithm_loss(cfg: PpoConfig, batch: dict, logprobs, old, values, kl_coef: float) -> tuple:
    """(loss, metrics) of a minibatch before the entropy bonus: the clipped policy loss plus the
    clipped value loss (ppo), or the policy loss of GRPO's loss_type (`train.grpo_losses`) plus the
    k3 KL to the reference at the rollout's β (grpo), or the clipped loss of whole responses alone
    (rloo); `old` are the sampling policy's log-probs."""
    mask, metrics = batch["response_mask"], {}
    if cfg.algo == "rloo":  # no KL term: the KL is in the rewards
        policy_loss, was_clipped = sequence_clipped_policy_loss(
            logprobs, old, batch["advantages"][:, 0], mask, cfg.clip_range, cfg.clip_range_high)
        loss, metrics["clipfrac"] = policy_loss, was_clipped.float().mean()
    elif cfg.algo == "ppo":
        per_token, was_clipped = clipped_policy_token_loss(
            logprobs, old, batch["advantages"], cfg.clip_range, cfg.clip_range_high)
        metrics["clipfrac"] = masked_mean(was_clipped.float(), mask)
        policy_loss = masked_mean(per_token, mask)
        value_loss, value_clipfrac = clipped_value_loss(
            values, batch["values"], batch["returns"], mask, cfg.clip_range_value)
        loss = policy_loss + cfg.vf_coef * value_loss
        metrics.update(value_loss=value_loss.detach(), value_clipfrac=value_clipfrac)
    else:
        per_token, ratio, was_clipped = grpo_token_loss(
            logprobs, old, batch["advantages"], mask, cfg.loss_type, level=cfg.importance_sampling_level,
            clip_range=cfg.clip_range, clip_range_high=cfg.clip_range_high, ratio_max=cfg.ratio_max,
            sapo_temperatures=(cfg.sapo_temperature_pos, cfg.sapo_temperature_neg),
            vespo=(cfg.vespo_k_pos, cfg.vespo_lambda_pos, cfg.vespo_k_neg, cfg.vespo_lambda_neg))
        if was_clipped is not None:  # sapo and vespo weigh softly: nothing is clipped
            metrics["clipfrac"] = masked_mean(was_clipped.expand_as(mask).float(), mask)
        aggregate = functools.partial(
            aggregate_token_loss, mask=mask, loss_type=cfg.loss_type, max_tokens=cfg.max_new_tokens,
            # a batch not served by next_batch is an optimizer step of its own
            tokens_per_micro_batch=batch.get(ITEMS_PER_MICRO_BATCH, mask.sum()))
        policy_loss = loss = aggregate(per_token)
        if "ref_logprobs" in batch:  # none at β = 0, where the term is 0
            kl = kl_estimate(logprobs, batch["ref_logprobs"], "k3")
            if cfg.kl_bias_correction:  # ρ is differentiable: it changes the gradient at ρ = 1 too
                kl = kl * ratio  # the response's ρ under importance_sampling_level=sequence, as TRL's
            kl_loss = aggregate(kl)
            # the aggregation is linear: this is TRL's aggregate of (policy loss + β·k3) per token,
            # with the β this rollout logged (adaptive_kl moves it between rollouts)
            loss = policy_loss + kl_coef * kl_loss
            metrics["kl_loss"] = kl_loss.detach()
    metrics["policy_loss"] = policy_loss.detach()
    return loss, metrics
