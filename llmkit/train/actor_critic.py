"""The module PPO trains (`ActorCritic`: the policy plus a value head), how `llmkit ppo` builds it,
and the log-probabilities of a rollout's response columns."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from llmkit.model.transformer import Transformer
from llmkit.train.rl_losses import logprobs_of


class ActorCritic(nn.Module):
    """The module PPO trains: the policy plus (for ppo) a value head, reading either the policy's
    own trunk (`value_trunk=None`: cheaper) or a trunk of its own (no interference between the
    two objectives). Only `policy` is the stage's output; the rest serves training.

    `forward(input_ids, attention_mask, prompt_len)` -> (logits [N, R, V], values [N, R] or None)
    of the response columns: position P + t − 1 predicts response token t, and its hidden state
    is the state whose value is V_t.
    """

    def __init__(self, policy: Transformer, with_value: bool = True,
                 value_trunk: Transformer | None = None):
        super().__init__()
        self.policy = policy
        self.value_trunk = value_trunk
        self.value_head = None
        if with_value:
            width = (value_trunk or policy).config.hidden_size
            # zero: the first value estimates are 0 and the value loss sends no gradient into a
            # shared trunk until the head has learnt something
            self.value_head = nn.Linear(width, 1)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    @property
    def config(self):
        return self.policy.config

    @property
    def aux_loss(self):
        """The MoE load-balancing loss of the last forward: the policy's, plus a value trunk's."""
        if self.value_trunk is None:
            return self.policy.aux_loss
        return self.policy.aux_loss + self.value_trunk.aux_loss

    @property
    def gradient_checkpointing(self) -> bool:
        return self.policy.gradient_checkpointing

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, on: bool) -> None:
        for trunk in (self.policy, self.value_trunk):
            if trunk is not None:
                trunk.gradient_checkpointing = on

    def forward(self, input_ids, attention_mask, prompt_len: int):
        hidden = response_hidden(self.policy, input_ids, attention_mask, prompt_len)
        logits = self.policy.lm_head(hidden).float()
        if self.value_head is None:
            return logits, None
        if self.value_trunk is not None:
            hidden = response_hidden(self.value_trunk, input_ids, attention_mask, prompt_len)
        return logits, self.value_head(hidden).squeeze(-1).float()


def response_hidden(trunk: Transformer, input_ids, attention_mask, prompt_len: int):
    """Hidden states of the positions that predict the response tokens: [N, R, hidden]."""
    return trunk.hidden_states(input_ids, attention_mask=attention_mask)[:, prompt_len - 1:-1]


def response_logprobs(model: Transformer, input_ids, attention_mask, prompt_len: int,
                      temperature: float = 1.0):
    """log π(response token) under `model` at `temperature` for every response column: [N, R]."""
    hidden = response_hidden(model, input_ids, attention_mask, prompt_len)
    return logprobs_of(model.lm_head(hidden) / temperature, input_ids[:, prompt_len:])


def build_actor_critic(policy: Transformer, cfg, reward_model=None) -> ActorCritic:
    """The trained module: grpo and rloo have no value model; ppo's value head sits on the policy's trunk
    or on a trunk of its own, started from the reward model when there is one (as InstructGPT
    does: it already reads how good a response is), else from the policy. `cfg`: a PpoConfig."""
    if cfg.algo != "ppo":
        return ActorCritic(policy, with_value=False)
    if cfg.value_model == "shared":
        return ActorCritic(policy)
    trunk = copy.deepcopy(reward_model.trunk if reward_model is not None else policy)
    if not trunk.config.tie_embeddings:
        trunk.lm_head.requires_grad_(False)  # a value trunk never predicts tokens
    model = ActorCritic(policy, value_trunk=trunk)
    if reward_model is not None:
        with torch.no_grad():
            model.value_head.weight.copy_(reward_model.score.weight)
    return model
