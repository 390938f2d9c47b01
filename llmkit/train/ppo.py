"""PPO and GRPO (`llmkit ppo`): reinforcement learning of a policy from a reward on its own samples.

PPO (Schulman et al. 2017, as applied to language models by Ziegler et al. 2019 and InstructGPT):
each rollout samples responses from the current policy with the KV cache, scores them with a
reward model and/or exact match against the prompt's answer (clipped, optionally normalised),
adds a per-token KL penalty to the frozen reference (k1 or k3; fixed or adaptive β), and turns
rewards into advantages with GAE against a learnt value head (on the policy's trunk or its
own), whitened. Several epochs of minibatches then minimise the clipped policy loss plus the
clipped value loss. GRPO (Shao et al. 2024) samples a group of responses per prompt instead,
uses each score relative to its group as the advantage of every token, and needs no value
model; its KL to the reference is a k3 term in the loss.

The file reads top to bottom: per-token maths (pure functions), the config, the trained module,
rollouts, the engine Task, the stage. Per-token tensors are [B, R] over the response tokens of a
rollout (R = longest response), right-padded, with `mask` 1 on real response tokens (the
stop token that ends a response included) and 0 on padding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.nn as nn

from llmkit.errors import ConfigError, UserError
from llmkit.decoding import generate, left_pad
from llmkit.model import Transformer
from llmkit.train.engine import Task
from llmkit.train.sft import GenerativeConfig


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


def group_relative_advantages(scores: torch.Tensor, group_size: int,
                              eps: float = 1e-4) -> torch.Tensor:
    """GRPO (Shao et al. 2024): each score minus its group's mean, over the group's std, where a
    group is `group_size` consecutive samples of one prompt. A group whose samples all scored
    the same gives 0 — nothing to learn from it."""
    if scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    grouped = scores.view(-1, group_size)
    std = grouped.std(-1, keepdim=True) if group_size > 1 else torch.ones_like(grouped[:, :1])
    return ((grouped - grouped.mean(-1, keepdim=True)) / (std + eps)).view(-1)


# ---- losses --------------------------------------------------------------------------------------

def clipped_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                        advantages: torch.Tensor, mask: torch.Tensor,
                        clip_range: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate (Schulman et al. 2017, eq. 7), negated to minimise, and the
    fraction of tokens where the clip was active:
    mean over tokens of max(−A·ρ, −A·clip(ρ, 1−ε, 1+ε)), ρ = π / π_old."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_range, 1 + clip_range)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    clipfrac = masked_mean((clipped > unclipped).float(), mask)
    return loss, clipfrac.detach()


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


# ---- configuration -------------------------------------------------------------------------------

@dataclass
class PPOConfig(GenerativeConfig):
    """The engine's settings (flat, as for sft/rm/dpo: `--set lr=…`) plus PPO's own.

    One optimizer step takes micro_batch_size × grad_accum responses of the current rollout;
    max_new_tokens bounds both rollouts and the held-out evaluation.
    """

    algo: Literal["ppo", "grpo"] = "ppo"  # grpo: group-relative advantages, no value model
    reward: Literal["auto", "model", "verify", "mix"] = "auto"  # auto: the reward model if one is given, else verify
    verify_weight: float = 1.0  # mix: score = reward-model score + verify_weight × verifiable reward
    partial_credit: bool = False  # verifiable reward of a wrong response: its similarity to the answer (1 − edit distance / length), not 0
    prompts_per_rollout: int = 16  # prompts sampled per rollout batch
    group_size: int = 4  # grpo: responses sampled per prompt (ppo samples one)
    ppo_epochs: int = 2  # passes over each rollout batch, in minibatches of micro_batch_size
    temperature: float = 1.0  # sampling temperature of rollouts
    top_k: int | None = None  # sample among the k likeliest tokens only; None = all
    top_p: float = 1.0  # nucleus sampling threshold; 1 = off
    clip_range: float = 0.2  # ε: the policy ratio is clipped to [1 − ε, 1 + ε]
    clip_range_value: float = 0.2  # a value may move at most this far from its rollout estimate
    vf_coef: float = 0.1  # weight of the value loss beside the policy loss
    entropy_coef: float = 0.0  # weight of an entropy bonus (0 = none)
    gamma: float = 1.0  # discount of GAE
    lam: float = 0.95  # λ of GAE (bias/variance trade-off of the advantages)
    whiten_advantages: bool = True  # normalise advantages to zero mean, unit variance per rollout
    kl_coef: float = 0.05  # β: per-token KL penalty in the reward (ppo) or weight of the KL loss (grpo)
    kl_estimator: Literal["k1", "k3"] = "k1"  # estimator of the per-token KL penalty (grpo's loss uses k3)
    adaptive_kl: bool = False  # steer β towards kl_target (Ziegler et al.) instead of keeping it fixed
    kl_target: float = 6.0  # adaptive_kl: the KL per sequence to aim for (nats)
    kl_horizon: int = 10000  # adaptive_kl: samples over which β adapts by about ±20%
    reward_clip: float | None = 5.0  # scores are clamped to ±reward_clip; None = no clamp
    normalize_reward: bool = False  # scale scores by running mean/std of all scores seen
    value_model: Literal["shared", "separate"] = "shared"  # value head on the policy's trunk, or its own trunk
    # the engine's settings, with defaults for RL fine-tuning: a small constant lr, no warmup
    max_steps: int = 200  # optimizer steps
    lr: float = 1e-5  # learning rate (constant unless min_lr is set lower)
    min_lr: float = 1e-5  # learning rate at the end of the cosine decay
    warmup_steps: int = 0  # linear warmup steps
    weight_decay: float = 0.0  # AdamW decay of matrices
    save_every: int = 0  # checkpoint every N steps; 0 = only at the end
    log_every: int = 1  # write metrics every N steps
    eval_every: int = 0  # ppo has no validation loss; held-out exact match runs at start and end

    def __post_init__(self):
        super().__post_init__()
        for name in ("prompts_per_rollout", "group_size", "ppo_epochs", "kl_horizon"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("clip_range", "clip_range_value", "vf_coef", "entropy_coef", "kl_coef",
                     "verify_weight"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ConfigError(f"gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0 (rollouts sample), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k must be >= 1 or null, got {self.top_k}")
        if self.reward_clip is not None and not self.reward_clip > 0:
            raise ConfigError(f"reward_clip must be > 0 or null, got {self.reward_clip}")
        if not self.kl_target > 0:
            raise ConfigError(f"kl_target must be > 0, got {self.kl_target}")
        if self.algo == "grpo" and self.group_size < 2:
            raise ConfigError("algo=grpo compares responses within a group: group_size must be >= 2")
        if self.zero_stage == 3:
            raise ConfigError("ppo samples rollouts from the whole policy on every process: use "
                              "zero_stage 0, 1 or 2")
        if self.rollout_size % self.micro_batch_size:
            raise ConfigError(
                f"a rollout of {self.rollout_size} responses does not split into minibatches of "
                f"micro_batch_size={self.micro_batch_size}; make prompts_per_rollout"
                f"{' × group_size' if self.algo == 'grpo' else ''} a multiple of it")

    @property
    def samples_per_prompt(self) -> int:
        return self.group_size if self.algo == "grpo" else 1

    @property
    def rollout_size(self) -> int:
        """Responses sampled per rollout batch."""
        return self.prompts_per_rollout * self.samples_per_prompt


# ---- the trained module --------------------------------------------------------------------------

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


# ---- rollouts ------------------------------------------------------------------------------------

@dataclass
class Prompt:
    ids: list[int]  # the prompt rendered for generation (chat template), as token ids
    answer: str | None = None  # the checkable answer, for the verifiable reward


@dataclass
class Samples:
    """Sampled responses as a scorer sees them, one row per sample."""

    input_ids: torch.Tensor       # [N, P + R] left-padded prompt, then the response
    attention_mask: torch.Tensor  # [N, P + R] 1 = real token
    prompt_len: int               # P
    response_mask: torch.Tensor   # [N, R] 1 = real response token (its stop token included)
    texts: list[str]              # decoded responses (stop token and padding left out)
    answers: list[str | None]     # each sample's prompt's answer

    @property
    def responses(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_len:]


Scorer = Callable[[Samples], torch.Tensor]  # sampled responses -> one score per row [N]


def response_mask_of(responses: torch.Tensor, stop_ids: list[int]) -> torch.Tensor:
    """1 on each response token up to and including its first stop token, 0 after it."""
    if not stop_ids:
        return torch.ones_like(responses)
    is_stop = torch.isin(responses, torch.tensor(stop_ids, device=responses.device)).long()
    stops_before = is_stop.cumsum(-1) - is_stop  # stop tokens strictly before each position
    return (stops_before == 0).long()


def verify_scorer(partial: bool = False) -> Scorer:
    """1 for a response that equals its prompt's answer (up to whitespace), else 0 — or, with
    partial credit, its similarity to the answer (`llmkit.rewards.answer_similarity`)."""
    from llmkit.rewards import verify_rewards

    def score(samples: Samples) -> torch.Tensor:
        if any(a is None for a in samples.answers):
            raise ValueError("the verifiable reward needs an answer for every prompt")
        return torch.tensor(verify_rewards(samples.texts, samples.answers, partial))

    return score


class PPOTask(Task):
    """PPO / GRPO as a task of the shared engine.

    `next_batch` serves minibatches of the current rollout and, when none is left, samples a new
    rollout from the current policy: `prompts_per_rollout` prompts (× group_size for grpo) in a
    seeded shuffled order, responses sampled with the KV cache, scored, and turned into
    advantages. Each rollout is used for `ppo_epochs` shuffled passes. `loss` is the clipped
    policy loss plus the clipped value loss (ppo) or the k3 KL to the reference (grpo).

    Resume: the prompt position, β and reward statistics are checkpointed; a run resumed from a
    checkpoint taken mid-rollout starts the next rollout (exact when save_every is a multiple of
    the optimizer steps per rollout).
    """

    perplexity = False  # a policy-gradient loss: exp(val_loss) is no perplexity

    def __init__(self, model: ActorCritic, reference: Transformer, prompts: list[Prompt],
                 scorer: Scorer, cfg: PPOConfig, *, stop_ids: list[int], pad_id: int,
                 decode: Callable[[list[int]], str]):
        super().__init__(model)
        if not prompts:
            raise ValueError("PPO needs at least one prompt")
        self.reference = reference.eval().requires_grad_(False)
        self.prompts, self.scorer, self.cfg = prompts, scorer, cfg
        self.stop_ids, self.pad_id, self.decode = list(stop_ids), pad_id, decode
        self.kl_ctl = (AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
                       if cfg.adaptive_kl else FixedKLController(cfg.kl_coef))
        self.score_moments = RunningMoments()
        self.prompt_epoch, self.prompt_cursor = 0, 0
        self.rollouts_done = 0
        self.reward_history: list[float] = []  # mean raw score of every rollout
        self._rollout: dict | None = None
        self._pending: list[torch.Tensor] = []  # row indices of the minibatches still to serve
        self._rollout_metrics: dict = {}

    # -- batches --------------------------------------------------------------------------------

    def next_batch(self, model):
        if not self._pending:
            rollout = self.make_rollout(getattr(model, "module", model))
            self._start_rollout(rollout)
        return select_rows(self._rollout, self._pending.pop(0))

    def _start_rollout(self, rollout: dict) -> None:
        n, size = len(rollout["input_ids"]), self.cfg.micro_batch_size
        self._rollout = rollout
        self._pending = [rows for _ in range(self.cfg.ppo_epochs)
                         for rows in torch.randperm(n).split(size)]

    def _next_prompts(self) -> list[Prompt]:
        """This process's prompts of the next rollout, each repeated samples_per_prompt times.
        All processes walk one seeded order and each takes its own slice of every block."""
        rank, world = _rank_and_world()
        n = self.cfg.prompts_per_rollout
        mine = self._take_prompts(n * world)[rank * n:(rank + 1) * n]
        return [p for p in mine for _ in range(self.cfg.samples_per_prompt)]

    def _take_prompts(self, count: int) -> list[Prompt]:
        out = []
        while len(out) < count:
            order = torch.randperm(len(self.prompts), generator=torch.Generator().manual_seed(
                self.cfg.seed * 100_003 + self.prompt_epoch))
            take = order[self.prompt_cursor:self.prompt_cursor + count - len(out)]
            out += [self.prompts[i] for i in take.tolist()]
            self.prompt_cursor += len(take)
            if self.prompt_cursor == len(self.prompts):
                self.prompt_epoch, self.prompt_cursor = self.prompt_epoch + 1, 0
        return out

    @torch.no_grad()
    def sample(self, policy: Transformer, prompts: list[Prompt]) -> Samples:
        """One response per prompt from `policy`, sampled with the rollout settings."""
        cfg, device = self.cfg, self.device or torch.device("cpu")
        ids, mask = left_pad([p.ids for p in prompts], self.pad_id)
        ids, mask = ids.to(device), mask.to(device)
        max_new = min(cfg.max_new_tokens, policy.config.max_seq_len - ids.shape[1])
        if max_new < 1:
            raise ValueError(f"a prompt of {ids.shape[1]} tokens leaves no room to respond within "
                             f"model.max_seq_len={policy.config.max_seq_len}")
        out = generate(policy, ids, max_new, temperature=cfg.temperature, top_k=cfg.top_k,
                       top_p=cfg.top_p, eos_id=self.stop_ids[0] if self.stop_ids else None,
                       attention_mask=mask)
        P = ids.shape[1]
        response_mask = response_mask_of(out[:, P:], self.stop_ids)
        responses = out[:, P:].masked_fill(response_mask == 0, self.pad_id)
        texts = [self.decode(_strip_stop(r[m.bool()].tolist(), self.stop_ids))
                 for r, m in zip(responses, response_mask)]
        return Samples(torch.cat([ids, responses], 1), torch.cat([mask, response_mask], 1), P,
                       response_mask, texts, [p.answer for p in prompts])

    @torch.no_grad()
    def make_rollout(self, module: ActorCritic) -> dict:
        """Sample, score and compute advantages for the next prompts; logs the rollout metrics."""
        cfg = self.cfg
        self.reference.to(self.device or "cpu", next(module.policy.parameters()).dtype)
        samples = self.sample(module.policy, self._next_prompts())
        ids, attn, P, mask = (samples.input_ids, samples.attention_mask, samples.prompt_len,
                              samples.response_mask)
        logits, values = module(ids, attn, P)
        # log-probs of the distribution the responses were sampled from (logits / temperature,
        # as TRL does): otherwise the ratio and the KL describe a policy that never sampled them
        logprobs = logprobs_of(logits / cfg.temperature, samples.responses)
        ref_logprobs = response_logprobs(self.reference, ids, attn, P, cfg.temperature)
        raw_scores = self.scorer(samples).to(logprobs.device, torch.float32)
        scores = clip_scores(raw_scores, cfg.reward_clip)
        if cfg.normalize_reward:
            self.score_moments.update(scores)
            scores = self.score_moments.normalize(scores)

        log_ratio = (logprobs - ref_logprobs) * mask
        sequence_kl = log_ratio.sum(-1).mean().item()  # k1 summed over each response
        rollout = {"input_ids": ids, "attention_mask": attn, "prompt_len": P,
                   "response_mask": mask, "logprobs": logprobs, "ref_logprobs": ref_logprobs}
        if cfg.algo == "ppo":
            kl = kl_estimate(logprobs, ref_logprobs, cfg.kl_estimator)
            rewards = token_rewards(scores, kl, mask, self.kl_ctl.value)
            advantages, returns = gae(rewards, values, mask, cfg.gamma, cfg.lam)
            if cfg.whiten_advantages:
                advantages = whiten(advantages, mask)
            rollout.update(values=values, returns=returns)
        else:
            advantages = group_relative_advantages(scores, cfg.group_size)[:, None] * mask
        rollout["advantages"] = advantages

        self.rollouts_done += 1
        self.reward_history.append(raw_scores.mean().item())
        self._rollout_metrics = {
            "kl": sequence_kl,
            "kl_coef": self.kl_ctl.value,
            "reward_mean": raw_scores.mean().item(),
            "reward_std": raw_scores.std().item() if len(raw_scores) > 1 else 0.0,
            "response_length": mask.sum(-1).float().mean().item(),
            "rollouts": float(self.rollouts_done),
        }
        self.kl_ctl.update(sequence_kl, n_steps=len(ids))
        return rollout

    # -- loss -----------------------------------------------------------------------------------

    def loss(self, model, batch):
        cfg = self.cfg
        mask = batch["response_mask"]
        logits, values = model(batch["input_ids"], batch["attention_mask"], batch["prompt_len"])
        logits = logits / cfg.temperature  # the sampling distribution, as in make_rollout
        logprobs = logprobs_of(logits, batch["input_ids"][:, batch["prompt_len"]:])
        policy_loss, clipfrac = clipped_policy_loss(logprobs, batch["logprobs"],
                                                    batch["advantages"], mask, cfg.clip_range)
        entropy = masked_mean(entropy_from_logits(logits if cfg.entropy_coef else logits.detach()),
                              mask)
        loss = policy_loss - cfg.entropy_coef * entropy
        metrics = {"policy_loss": policy_loss.detach(), "clipfrac": clipfrac,
                   "entropy": entropy.detach(),
                   "approx_kl_old": masked_mean(batch["logprobs"] - logprobs.detach(), mask)}
        if cfg.algo == "ppo":
            value_loss, value_clipfrac = clipped_value_loss(
                values, batch["values"], batch["returns"], mask, cfg.clip_range_value)
            loss = loss + cfg.vf_coef * value_loss
            metrics.update(value_loss=value_loss.detach(), value_clipfrac=value_clipfrac)
        else:
            kl_loss = masked_mean(kl_estimate(logprobs, batch["ref_logprobs"], "k3"), mask)
            loss = loss + cfg.kl_coef * kl_loss
            metrics["kl_loss"] = kl_loss.detach()
        return loss, {**metrics, **self._rollout_metrics}

    def batch_tokens(self, batch) -> int:
        return int(batch["attention_mask"].sum())

    def checkpoint_module(self, module: ActorCritic) -> Transformer:
        return module.policy  # the stage's output is a plain policy; the value head stays in ds/

    # -- resume ---------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"prompt_epoch": self.prompt_epoch, "prompt_cursor": self.prompt_cursor,
                "rollouts_done": self.rollouts_done, "kl_coef": self.kl_ctl.value,
                "score_moments": self.score_moments.state_dict(),
                "reward_history": list(self.reward_history)}

    def load_state_dict(self, state: dict) -> None:
        self.prompt_epoch, self.prompt_cursor = state["prompt_epoch"], state["prompt_cursor"]
        self.rollouts_done = state["rollouts_done"]
        self.kl_ctl.value = state["kl_coef"]
        self.score_moments.load_state_dict(state["score_moments"])
        self.reward_history = list(state["reward_history"])
        self._rollout, self._pending = None, []


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def select_rows(rollout: dict, rows: torch.Tensor) -> dict:
    """A minibatch: the rows `rows` of a rollout, trimmed to their longest response."""
    P = rollout["prompt_len"]
    width = max(int(rollout["response_mask"][rows].sum(-1).max()), 1)
    batch = {"prompt_len": P}
    for key, value in rollout.items():
        if key == "prompt_len":
            continue
        columns = P + width if key in ("input_ids", "attention_mask") else width
        batch[key] = value[rows, :columns]
    return batch


def _strip_stop(tokens: list[int], stop_ids: list[int]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in stop_ids else tokens


# ---- the stage -----------------------------------------------------------------------------------

def reward_model_scorer(reward_model) -> Scorer:
    """The reward model's score of prompt + response, read at the response's last token."""

    def score(samples: Samples) -> torch.Tensor:
        device = samples.input_ids.device
        return reward_model.to(device)(samples.input_ids, samples.attention_mask).float()

    return score


def mixed_scorer(reward_model, verify_weight: float, partial: bool = False) -> Scorer:
    """Reward-model score plus verify_weight × the verifiable reward."""
    by_model, by_answer = reward_model_scorer(reward_model), verify_scorer(partial)

    def score(samples: Samples) -> torch.Tensor:
        return by_model(samples) + verify_weight * by_answer(samples).to(samples.input_ids.device)

    return score


def reward_mode(cfg: PPOConfig, has_reward_model: bool) -> str:
    """model | verify | mix, checked against what was given."""
    mode = cfg.reward if cfg.reward != "auto" else ("model" if has_reward_model else "verify")
    if mode in ("model", "mix") and not has_reward_model:
        raise ConfigError(f"reward={mode} needs a reward model: pass --reward RM (a `llmkit rm` "
                          "run), or use reward=verify")
    return mode


def prompt_set(tokenizer, rows: list[dict], cfg: PPOConfig, where, needs_answer: bool):
    """(prompts rendered for generation, rows dropped because no reply would fit in seq_len)."""
    from llmkit.data.chat import prompt_messages

    room = cfg.seq_len - cfg.max_new_tokens
    prompts, dropped = [], 0
    for row in rows:
        if row.get("prompt") is None and not row.get("messages"):
            raise UserError(f"{where}: row {row.get('id')!r} has no prompt; ingest prompts with "
                            "`llmkit ingest --kind prompt`")
        answer = row.get("answer")
        if needs_answer and answer is None:
            raise UserError(f"{where}: row {row.get('id')!r} has no `answer`, which the verifiable "
                            "reward checks; give every row an answer or pass --reward RM")
        ids, _ = tokenizer.encode_chat(prompt_messages(row), add_generation_prompt=True)
        if len(ids) > room:
            dropped += 1
            continue
        prompts.append(Prompt(ids, None if answer is None else str(answer)))
    return prompts, dropped


def build_actor_critic(policy: Transformer, cfg: PPOConfig, reward_model=None) -> ActorCritic:
    """The trained module: grpo has no value model; ppo's value head sits on the policy's trunk
    or on a trunk of its own, started from the reward model when there is one (as InstructGPT
    does: it already reads how good a response is), else from the policy."""
    import copy

    if cfg.algo == "grpo":
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


def window_mean(values: list[float], first: bool) -> float | None:
    """Mean of the first (or last) tenth of `values`, at least one of them."""
    if not values:
        return None
    k = max(1, len(values) // 10)
    chunk = values[:k] if first else values[-k:]
    return sum(chunk) / len(chunk)


def run_ppo(ctx, cfg: PPOConfig, policy: str = "sft", reward_model: str | None = None,
            eval_data: str | None = None):
    """`llmkit ppo`: PPO (or GRPO) of checkpoint `policy` on the prompts of --in (default
    prompts_train), rewarded by a reward model and/or exact match against each prompt's answer.

    Held-out prompts (--eval, else a stable share of --in) are answered greedily before and
    after training: exact match in `stats.base_accuracy` and `stats.accuracy`, the mean
    similarity to the answer in `stats.base_similarity` and `stats.similarity`. `stats.reward_start` /
    `reward_end` are the mean training reward of the first and last tenth of the rollouts.
    """
    import copy
    import time

    from llmkit.api import load_tokenizer
    from llmkit.progress import print_summary
    from llmkit.tokenizer import same_tokenizer
    from llmkit.train.checkpoint import open_run, training_run
    from llmkit.train.engine import Engine
    from llmkit.train.pretrain import starting_weights
    from llmkit.train.rm import load_reward_model
    from llmkit.train.sft import evaluate_answers, load_start, read_rows, split_rows

    policy_art, policy_step = starting_weights(ctx.workspace, policy)
    prompts_art = ctx.input(default="prompts_train")
    rm_art, rm_step = starting_weights(ctx.workspace, reward_model) if reward_model else (None, None)
    eval_art = ctx.workspace.artifact(eval_data) if eval_data else None
    mode = reward_mode(cfg, rm_art is not None)
    inputs = [a for a in (policy_art, prompts_art, rm_art, eval_art) if a is not None]
    b, plan = open_run(ctx, "ppo", cfg, inputs)
    if b.up_to_date:
        return b

    model, tokenizer = load_start(policy_step, cfg)
    rm = None
    if rm_art is not None and (mode != "verify" or cfg.value_model == "separate"):
        rm = load_reward_model(rm_step)
        if not same_tokenizer(tokenizer.path, load_tokenizer(rm_step).path):
            raise UserError(f"{rm_art.path} and {policy_art.path} use different tokenizers; train "
                            "the reward model from the same base as the policy")
    rows = read_rows(prompts_art, ())
    train_rows, heldout = split_rows(rows, read_rows(eval_art, ()) if eval_art else None,
                                     cfg.eval_fraction, cfg.seed)
    prompts, dropped = prompt_set(tokenizer, train_rows, cfg, prompts_art.path,
                                  needs_answer=mode != "model")
    if not prompts:
        raise UserError(f"{prompts_art.path}: no prompt leaves room for a reply within seq_len="
                        f"{cfg.seq_len} and max_new_tokens={cfg.max_new_tokens}")
    scorer = {"model": lambda: reward_model_scorer(rm),
              "verify": lambda: verify_scorer(cfg.partial_credit),
              "mix": lambda: mixed_scorer(rm, cfg.verify_weight, cfg.partial_credit)}[mode]()
    scored = [r for r in heldout if r.get("answer") is not None][:cfg.eval_records]

    with training_run(b, plan) as dist:
        model.to(dist.device)
        # held-out generation on the main process alone; the others wait in the engine's setup
        before = evaluate_answers(model, tokenizer, scored, cfg.max_new_tokens) if dist.is_main else None
        reference = copy.deepcopy(model)
        task = PPOTask(build_actor_critic(model, cfg, rm), reference, prompts, scorer, cfg,
                       stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id,
                       decode=tokenizer.decode)
        result = Engine(b.dir, cfg.train_config(), task, tokenizer_dir=tokenizer.path,
                        model_config=model.config).fit()
        if not dist.is_main:
            return b
        after = evaluate_answers(model, tokenizer, scored, cfg.max_new_tokens)
        b.stats.update(
            reward=mode, algo=cfg.algo, train_prompts=len(prompts), dropped_too_long=dropped,
            heldout_rows=len(heldout), eval_records=len(scored), steps=result.step,
            rollouts=task.rollouts_done, tokens_seen=result.tokens_seen,
            reward_start=window_mean(task.reward_history, first=True),
            reward_end=window_mean(task.reward_history, first=False),
            kl=result.metrics.get("kl"), base_accuracy=before["exact_match"],
            accuracy=after["exact_match"], base_similarity=before["similarity"],
            similarity=after["similarity"])
    print_summary(f"{b.name} done", [
        ("steps", result.step), ("rollouts", task.rollouts_done),
        ("reward", f"{b.stats['reward_start']:.3f} -> {b.stats['reward_end']:.3f} ({mode})"),
        ("held-out exact match", f"{before['exact_match']:.3f} -> {after['exact_match']:.3f} "
                                 f"({len(scored)} rows)"),
        ("held-out similarity", f"{before['similarity']:.3f} -> {after['similarity']:.3f}"),
        ("seconds", round(time.time() - b.started, 1))])
    return b
