"""The reward model: a transformer trunk with a scalar head (`llmkit rm` trains it; ppo and eval
score with it).

`RewardModel` has the parameter names of Hugging Face `LlamaForSequenceClassification`
(`model.*` for the trunk, `score.weight` for the head), so a reward checkpoint is the trunk's
usual weights plus `score.weight`; its config.json carries `"llmkit_head": "reward"`, which
`llmkit.checkpoints.loading.load_reward_model` checks.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from llmkit.model.transformer import Transformer

REWARD_HEAD = "reward"
HEAD_KEY = "llmkit_head"


class RewardModel(nn.Module):
    """`forward(input_ids, attention_mask) -> rewards [B]`, read at each row's last real token.

    The trunk's blocks are registered as `self.model` (its lm_head is not used, so it is not a
    parameter of the reward model); the trunk object itself is kept unregistered so that the
    state_dict names are the trunk's `model.*` names, not `trunk.model.*`.
    """

    heads_trained_in_full = ("score",)  # under LoRA: a new head has no weights to adapt
    peft_task_type = "SEQ_CLS"  # what peft calls a trunk with a scalar head

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
