"""Reward modelling (`llmkit rm`): a transformer trunk with a scalar head (`RewardModel`), trained
on preference pairs with the Bradley–Terry loss and scored by held-out pairwise accuracy.
`llmkit.checkpoints.loading.load_reward_model(path)` gives a trained one back, for `ppo` and `eval`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmkit.data.chat import fixed_batches
from llmkit.dryrun import head_parameters, parameters, plan
from llmkit.errors import ConfigError
from llmkit.train.losses import bradley_terry_loss
from llmkit.train.planning import (dense_attention_mask, lora_split, model_shape, post_training_plan, show,
                                   world_size)
from llmkit.train.posttrain import (PostTrainConfig, batch_stream, holds_whole_model, load_start,
                                    post_training_inputs, preference_data)
from llmkit.model.reward_model import RewardModel
from llmkit.train.stage import LOSSES, Fit, fit_stage
from llmkit.train.task import Task, to_device


@dataclass
class RmConfig(PostTrainConfig):
    micro_batch_size: int = 8  # preference pairs per forward (2x sequences)
    center_coef: float = 0.0  # η of the centring term η·mean((r_c + r_r)²); ~0.01 keeps rewards near 0

    def __post_init__(self):
        super().__post_init__()
        if self.center_coef < 0:
            raise ConfigError(f"center_coef must be >= 0, got {self.center_coef}")


def split_rewards(rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A pair batch holds the chosen rows first, then the rejected ones."""
    half = len(rewards) // 2
    return rewards[:half], rewards[half:]


def pair_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict:
    chosen, rejected = chosen.detach().float(), rejected.detach().float()
    return {"accuracy": (chosen > rejected).float().mean(),
            "rewards/chosen": chosen.mean(), "rewards/rejected": rejected.mean(),
            "rewards/margins": (chosen - rejected).mean()}


class RmTask(Task):
    """Bradley–Terry loss on (chosen, rejected) reward pairs, with pairwise accuracy."""

    perplexity = False  # a Bradley–Terry loss: exp(val_loss) is no perplexity

    def __init__(self, model, train_data, eval_data, center_coef: float, seq_len: int):
        super().__init__(model, train_data, eval_data)
        self.center_coef, self.seq_len = center_coef, seq_len

    def loss(self, model, batch):
        chosen, rejected = split_rewards(model(batch["input_ids"], batch["attention_mask"]))
        loss = bradley_terry_loss(chosen, rejected, batch["margin"], self.center_coef)
        return loss + model.aux_loss, pair_metrics(chosen, rejected)

    def flops_per_token(self) -> float:
        return self.model.trunk.flops_per_token(self.seq_len)


@torch.no_grad()
def pairwise_accuracy(reward_model: RewardModel, batches: list[dict]) -> float:
    """Share of pairs whose chosen reply gets the higher reward (ties count as wrong)."""
    device = next(reward_model.parameters()).device
    was_training = reward_model.training
    reward_model.eval()
    right = total = 0
    for batch in batches:
        batch = to_device(batch, device)
        chosen, rejected = split_rewards(reward_model(batch["input_ids"], batch["attention_mask"]))
        right += int((chosen > rejected).sum())
        total += len(chosen)
    reward_model.train(was_training)
    return right / total if total else float("nan")


def pairwise_scorer(cfg: RmConfig, eval_batches: list[dict]):
    """`score(reward_model, dist) -> {"accuracy": pairwise accuracy or None}`, for `Fit.score`."""

    def score(reward_model, dist):
        whole = holds_whole_model(cfg, dist)
        return {"accuracy": round(pairwise_accuracy(reward_model, eval_batches), 4) if whole else None}

    return score


def rm_summary(stats: dict) -> list[tuple]:
    return [("final loss", stats["final_loss"]),
            ("held-out pairwise accuracy",
             f"{stats['base_accuracy']} -> {stats['accuracy']} ({stats['heldout_pairs']} pairs)")]


def run_rm(ctx, cfg: RmConfig, base: str, eval_data: str | None = None):
    """`llmkit rm`: a reward model from checkpoint `base` on the preference pairs of --in."""
    base_art, base_step, data_art, eval_art = post_training_inputs(ctx, "rm", cfg, base, eval_data)

    def prepare() -> Fit:
        trunk, tokenizer = load_start(base_step, cfg)
        data = preference_data(tokenizer, data_art, eval_art, cfg)
        eval_batches = fixed_batches(data.eval_pairs, data.collate, cfg.micro_batch_size)
        torch.manual_seed(cfg.seed)  # the score head's initial weights
        reward_model = RewardModel(trunk)
        return Fit(lambda dist: RmTask(reward_model, batch_stream(data.pairs, data.collate, cfg, dist),
                                       eval_batches or None, cfg.center_coef, cfg.seq_len),
                   tokenizer.path, rm_summary, model=reward_model, start=base_step, metrics=LOSSES,
                   model_config=reward_model.checkpoint_config(),
                   score=pairwise_scorer(cfg, eval_batches),
                   stats={**data.counts, "train_rows": len(data.train_rows),
                          "heldout_pairs": len(data.eval_pairs)})

    return fit_stage(ctx, "rm", cfg, [base_art, data_art, eval_art], prepare)


def plan_rm(ctx, cfg, base: str, eval_data: str | None) -> None:
    """`llmkit rm --dry-run`: what run_rm would do, from the inputs it would read."""
    step_dir, notes, _, _ = post_training_plan(ctx, "rm", cfg, base, eval_data)
    shape, _ = model_shape(step_dir)
    n = parameters(shape) - head_parameters(shape) + shape.hidden_size  # score head, no LM head
    world = world_size()
    pairs = cfg.micro_batch_size * cfg.grad_accum * world
    adapters, base = lora_split(shape, n - shape.hidden_size, cfg)
    trainable = adapters + shape.hidden_size if base else n  # the score head trains in full
    show(ctx, plan("rm", shape, trainable=trainable, total=trainable + base, frozen=base,
              saved=trainable if base else None, unit="pairs", per_step=pairs,
              tokens_per_step=2 * pairs * cfg.seq_len, sequences=2 * cfg.micro_batch_size,
              seq_len=cfg.seq_len, cfg=cfg, world_size=world, loss_positions=0,
              dense_mask=dense_attention_mask(), notes=notes))
