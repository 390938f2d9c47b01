"""Reward modelling (`llmkit rm`): a transformer trunk with a scalar head, trained on preference
pairs with the Bradley–Terry loss.

`RewardModel` has the parameter names of Hugging Face `LlamaForSequenceClassification`
(`model.*` for the trunk, `score.weight` for the head), so a reward checkpoint is the trunk's
usual weights plus `score.weight`; its config.json carries `"llmkit_head": "reward"`.
`load_reward_model(path)` gives one back in eval mode, for `ppo` and `eval`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn as nn

from llmkit.errors import ConfigError, UserError
from llmkit.model import ModelConfig, Transformer
from llmkit.train.engine import Task
from llmkit.train.losses import bradley_terry_loss
from llmkit.train.sft import PostTrainConfig

REWARD_HEAD = "reward"
HEAD_KEY = "llmkit_head"


class RewardModel(nn.Module):
    """`forward(input_ids, attention_mask) -> rewards [B]`, read at each row's last real token.

    The trunk's blocks are registered as `self.model` (its lm_head is not used, so it is not a
    parameter of the reward model); the trunk object itself is kept unregistered so that the
    state_dict names are the trunk's `model.*` names, not `trunk.model.*`.
    """

    def __init__(self, trunk: Transformer):
        super().__init__()
        self.__dict__["trunk"] = trunk
        self.config = trunk.config
        self.model = trunk.model
        self.score = nn.Linear(trunk.config.hidden_size, 1, bias=False)
        nn.init.normal_(self.score.weight, std=trunk.config.init_std)

    @property
    def gradient_checkpointing(self) -> bool:
        return self.trunk.gradient_checkpointing

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, on: bool) -> None:
        self.trunk.gradient_checkpointing = on

    @property
    def aux_loss(self):
        return self.trunk.aux_loss

    def _apply(self, fn, *args, **kwargs):
        # the trunk's RoPE tables are buffers of the (unregistered) trunk: move them too
        super()._apply(fn, *args, **kwargs)
        for name, buffer in list(self.trunk.named_buffers(recurse=False)):
            setattr(self.trunk, name, fn(buffer))
        return self

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        right_padded = bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())
        # right padding never reaches a real token under the causal mask: skip the explicit mask
        hidden = self.trunk.hidden_states(
            input_ids, attention_mask=None if right_padded else attention_mask)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        last = (attention_mask.bool() * positions).argmax(-1)
        picked = hidden[torch.arange(len(input_ids), device=input_ids.device), last]
        return self.score(picked).squeeze(-1).float()

    def checkpoint_config(self) -> dict:
        """What the engine writes as config.json: the model config, marked as a reward model."""
        return {**dataclasses.asdict(self.config), HEAD_KEY: REWARD_HEAD}


def model_config_from(config: dict, path) -> ModelConfig:
    """ModelConfig of a checkpoint's config.json, without llmkit's own marker keys."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    try:
        return ModelConfig(**{k: v for k, v in config.items() if k in fields})
    except (TypeError, ConfigError) as e:
        raise UserError(f"{path}: config.json is not an llmkit model config ({e})") from None


def load_reward_model(path) -> RewardModel:
    """The reward model of a checkpoint run (its latest step) or step folder, in eval mode."""
    from llmkit.train.checkpoint import load_weights

    state_dict, config = load_weights(path)
    if config.get(HEAD_KEY) != REWARD_HEAD:
        raise UserError(f"{path} is not a reward model (its config.json lacks "
                        f'"{HEAD_KEY}": "{REWARD_HEAD}"); train one with `llmkit rm`')
    reward_model = RewardModel(Transformer(model_config_from(config, path)))
    reward_model.load_state_dict(state_dict, strict=True)
    return reward_model.eval()


# -- the trainer ---------------------------------------------------------------------------

@dataclass
class RmConfig(PostTrainConfig):
    max_steps: int = 200  # optimizer steps
    micro_batch_size: int = 8  # preference pairs per forward (2x sequences)
    lr: float = 1e-4  # peak learning rate
    min_lr: float = 1e-5  # learning rate at the end of the cosine decay
    warmup_steps: int | None = None  # linear warmup steps; None = 10, or 10% of a shorter run
    AUTO_WARMUP: ClassVar[int] = 10
    weight_decay: float = 0.0  # AdamW decay of matrices
    save_every: int = 0  # checkpoint every N steps; 0 = only at the end
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


class RewardTask(Task):
    """Bradley–Terry loss on (chosen, rejected) reward pairs, with pairwise accuracy."""

    perplexity = False  # a Bradley–Terry loss: exp(val_loss) is no perplexity

    def __init__(self, model, train_data, eval_data, center_coef: float, seq_len: int):
        super().__init__(model, train_data, eval_data)
        self.center_coef, self.seq_len = center_coef, seq_len

    def loss(self, model, batch):
        chosen, rejected = split_rewards(model(batch["input_ids"], batch["attention_mask"]))
        loss = bradley_terry_loss(chosen, rejected, batch["margin"], self.center_coef)
        return loss + model.aux_loss, pair_metrics(chosen, rejected)

    def batch_tokens(self, batch) -> int:
        return int(batch["attention_mask"].sum())

    def flops_per_token(self) -> float:
        return self.model.trunk.flops_per_token(self.seq_len)


@torch.no_grad()
def pairwise_accuracy(reward_model: RewardModel, batches: list[dict]) -> float:
    """Share of pairs whose chosen reply gets the higher reward (ties count as wrong)."""
    from llmkit.train.engine import to_device

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


def run_rm(ctx, cfg: RmConfig, base: str, eval_data: str | None = None):
    """`llmkit rm`: a reward model from checkpoint `base` on the preference pairs of --in."""
    from llmkit.data.chat import BatchStream, fixed_batches
    from llmkit.progress import print_summary
    from llmkit.train.checkpoint import open_run, training_run
    from llmkit.train.engine import Engine
    from llmkit.train.pretrain import starting_weights
    from llmkit.train.sft import load_start, preference_data

    base_art, base_step = starting_weights(ctx.workspace, base)
    data_art = ctx.input(default="pref_train")
    eval_art = ctx.workspace.artifact(eval_data) if eval_data else None
    b, plan = open_run(ctx, "rm", cfg, [a for a in (base_art, data_art, eval_art) if a])
    if b.up_to_date:
        return b
    trunk, tokenizer = load_start(base_step, cfg)
    data = preference_data(tokenizer, data_art, eval_art, cfg)
    eval_batches = fixed_batches(data.eval_pairs, data.collate, cfg.micro_batch_size)
    torch.manual_seed(cfg.seed)  # the score head's initial weights
    reward_model = RewardModel(trunk)
    with training_run(b, plan) as dist:
        whole = dist.is_main and not (cfg.zero_stage == 3 and dist.world_size > 1)

        def score(model):
            return round(pairwise_accuracy(model, eval_batches), 4) if whole else None

        base_accuracy = score(reward_model.to(dist.device))
        stream = BatchStream(data.pairs, data.collate, micro_batch_size=cfg.micro_batch_size,
                             seq_len=cfg.seq_len, seed=cfg.seed, rank=dist.rank,
                             world_size=dist.world_size)
        task = RewardTask(reward_model, stream, eval_batches or None, cfg.center_coef, cfg.seq_len)
        result = Engine(b.final, cfg.train_config(), task, tokenizer_dir=tokenizer.path,
                        model_config=reward_model.checkpoint_config()).fit()
        accuracy = score(reward_model)
        b.stats.update(**data.counts, train_rows=len(data.train_rows),
                       heldout_pairs=len(data.eval_pairs),
                       steps=result.step, tokens_seen=result.tokens_seen,
                       final_loss=result.metrics.get("loss"), val_loss=result.metrics.get("val_loss"),
                       base_accuracy=base_accuracy, accuracy=accuracy)
    if dist.is_main:
        print_summary(f"{b.name} done", [
            ("steps", result.step), ("final loss", result.metrics.get("loss")),
            ("held-out pairwise accuracy", f"{base_accuracy} -> {accuracy} "
                                           f"({len(data.eval_pairs)} pairs)"),
            ("seconds", round(time.time() - b.started, 1))])
    return b
