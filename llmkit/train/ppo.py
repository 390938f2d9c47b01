"""PPO, GRPO and RLOO (`llmkit ppo`): reinforcement learning of a policy from a reward on its own samples.

PPO (Schulman et al. 2017, as applied to language models by Ziegler et al. 2019 and InstructGPT):
each rollout samples responses from the current policy with the KV cache, scores them with a
reward model and/or exact match against the prompt's answer (optionally penalised for a missing
stop token, clipped, normalised), adds a per-token KL penalty to the frozen reference (k1 or k3;
fixed or adaptive β; under LoRA the policy with its adapters disabled), and turns rewards into
advantages with GAE against a learnt value head (on the policy's trunk or its own), whitened. Several epochs of minibatches then minimise the clipped policy loss plus the
clipped value loss. GRPO (Shao et al. 2024) samples a group of responses per prompt instead,
uses each score relative to its group as the advantage of every token, and needs no value
model; its KL to the reference is a k3 term in the loss, and its per-token losses become one
as TRL's `loss_type` says (default dapo: a mean over every token of the optimizer step).
RLOO (Ahmadian et al. 2024, as TRL's RLOOTrainer) samples a group too, but treats a response as
one action: β times its summed k1 KL comes off its score, its advantage is that reward less the
mean of its siblings' (leave-one-out), and the clipped ratio is that of its whole log-probability.

The file reads top to bottom: the config, the trained module, rollouts, the engine Task, the
stage. The per-token maths (masked statistics, KL estimators and controllers, GAE, the clipped
losses) are pure functions in `train.losses`; the scorers of sampled responses are in
`llmkit.rewards`. Per-token tensors are [B, R] over the response tokens of a rollout (R =
longest response), right-padded, with `mask` 1 on real response tokens (the stop token that
ends a response included) and 0 on padding.

Held-out prompts (--eval, else a stable share of --in) are answered greedily before and after
training: exact match in `stats.base_accuracy` and `stats.accuracy`, the mean similarity to the
answer in `stats.base_similarity` and `stats.similarity`. `stats.reward_start` / `reward_end`
are the mean training reward of the first and last tenth of the rollouts.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, ClassVar, Literal

import torch

from llmkit.errors import ConfigError, UserError
from llmkit.model import Transformer
from llmkit.rewards import Scorer, reward_mode, rollout_scorer
from llmkit.train.actor_critic import ActorCritic, build_actor_critic, response_logprobs
from llmkit.train.loading import load_reward_model, load_tokenizer, starting_weights
from llmkit.train.lora import adapters_disabled, adapters_of
from llmkit.train.losses import (AdaptiveKLController, FixedKLController, GrpoLossType,
                                 RewardScaling, RunningMoments, aggregate_token_loss, clip_scores,
                                 clipped_policy_token_loss, clipped_value_loss, entropy_from_logits,
                                 gae, group_relative_advantages, kl_estimate, kl_penalized_scores,
                                 leave_one_out_advantages, logprobs_of, masked_mean, penalize_missing_stop,
                                 sequence_clipped_policy_loss, token_rewards, whiten)
from llmkit.train.posttrain import (GenerativeConfig, evaluate_answers, heldout_split, load_start,
                                    post_training_inputs)
from llmkit.train.rollouts import (Prompt, Samples, ends_with_stop, mean_over_processes, over_processes,
                                   rank_and_world, rollout_prompts, sample_responses, select_rows)
from llmkit.train.stage import Fit, fit_stage
from llmkit.train.task import ITEMS_PER_MICRO_BATCH, Task


# ---- configuration -------------------------------------------------------------------------------

@dataclass
class PpoConfig(GenerativeConfig):
    """The engine's settings (flat, as for sft/rm/dpo: `--set lr=…`) plus PPO's own.

    One optimizer step takes micro_batch_size × grad_accum responses of the current rollout;
    max_new_tokens bounds both rollouts and the held-out evaluation. A setting that only some
    algorithms read is refused when set under another (`READ_ONLY_BY`).
    """

    READ_ONLY_BY: ClassVar[dict] = {
        # the value model, GAE and the per-token KL penalty in the reward: only ppo has them
        **dict.fromkeys(("gamma", "lam", "whiten_advantages", "vf_coef", "clip_range_value",
                         "value_model", "kl_estimator"), ("ppo",)),
        **dict.fromkeys(("loss_type", "scale_rewards", "kl_bias_correction"), ("grpo",)),
        "mask_truncated_completions": ("grpo", "rloo"), "normalize_advantages": ("rloo",)}

    algo: Literal["ppo", "grpo", "rloo"] = "ppo"  # grpo, rloo: advantages within a group of samples, no value model
    reward: Literal["auto", "model", "verify", "mix"] = "auto"  # auto: the reward model if one is given, else verify
    verify_weight: float = 1.0  # mix: score = reward-model score + verify_weight × verifiable reward
    partial_credit: bool = False  # verifiable reward of a wrong response: its similarity to the answer (1 − edit distance / length), not 0
    prompts_per_rollout: int = 16  # prompts sampled per rollout batch
    group_size: int = 4  # grpo, rloo: responses sampled per prompt (ppo samples one)
    ppo_epochs: int = 2  # passes over each rollout batch, in minibatches of micro_batch_size
    # rollouts sample the whole distribution (no top-k / top-p, as TRL's): the ratio's
    # log-probs are those of logits / temperature, so a truncated sampler would be off-policy
    temperature: float = 1.0  # sampling temperature of rollouts
    clip_range: float = 0.2  # ε: the policy ratio is clipped to [1 − ε, 1 + ε_high]
    clip_range_high: float | None = None  # ε_high (DAPO's clip-higher, TRL's epsilon_high; DAPO uses 0.28); None = clip_range
    # grpo: how per-token losses become one (TRL's loss_type and its default): grpo = mean of each
    # sequence's token mean (the paper), bnpo = token mean of the micro-batch, dr_grpo = token sum
    # / (sequences × max_new_tokens), dapo = token mean over the whole optimizer step (every
    # micro-batch and process). ppo keeps the token mean of the micro-batch, as TRL's PPOTrainer
    # and OpenRLHF (token_level_loss) do.
    loss_type: GrpoLossType = "dapo"
    scale_rewards: RewardScaling = "group"  # grpo: divide score − group mean by the group's std, the batch's (all processes), or nothing (Dr. GRPO)
    mask_truncated_completions: bool = False  # grpo, rloo: a response cut off before its stop token takes no part in the loss (DAPO, TRL's)
    clip_range_value: float = 0.2  # a value may move at most this far from its rollout estimate
    vf_coef: float = 0.1  # weight of the value loss beside the policy loss
    entropy_coef: float = 0.0  # weight of an entropy bonus (0 = none)
    gamma: float = 1.0  # discount of GAE
    lam: float = 0.95  # λ of GAE (bias/variance trade-off of the advantages)
    whiten_advantages: bool = True  # normalise advantages to zero mean, unit variance per rollout
    normalize_advantages: bool = False  # rloo: the same over the rollout of every process (TRL's normalize_advantages)
    kl_coef: float = 0.05  # β: KL penalty in the reward (ppo per token, rloo per response) or weight of the KL loss (grpo)
    kl_estimator: Literal["k1", "k3"] = "k1"  # estimator of the per-token KL penalty (grpo's loss uses k3)
    kl_bias_correction: bool = False  # grpo: k3 times the ratio π/π_old, an unbiased reverse-KL gradient (DeepSeek-V3.2; TRL's use_bias_correction_kl, on there)
    adaptive_kl: bool = False  # steer β towards kl_target (Ziegler et al.) instead of keeping it fixed
    kl_target: float = 6.0  # adaptive_kl: the KL per sequence to aim for (nats)
    kl_horizon: int = 10000  # adaptive_kl: samples over which β adapts by about ±20%
    reward_clip: float | None = None  # scores are clamped to ±reward_clip; None = no clamp (as TRL)
    missing_eos_penalty: float | None = None  # subtracted from the score of a response cut off before its stop token (TRL's)
    normalize_reward: bool = False  # scale scores by running mean/std of all scores seen
    value_model: Literal["shared", "separate"] = "shared"  # value head on the policy's trunk, or its own trunk
    # the engine's settings where RL fine-tuning differs from the others: a small constant lr
    # (min_lr is post-training's 1e-5 too), no warmup
    lr: float = 1e-5  # learning rate (constant unless min_lr is set lower)
    warmup_steps: int = 0  # linear warmup steps
    log_every: int = 1  # write metrics every N steps
    eval_every: int = 0  # ppo has no validation loss; held-out exact match runs at start and end

    def __post_init__(self):
        super().__post_init__()
        for name in ("prompts_per_rollout", "group_size", "ppo_epochs", "kl_horizon"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("clip_range", "clip_range_value", "vf_coef", "entropy_coef", "kl_coef",
                     "verify_weight", "clip_range_high"):
            if (getattr(self, name) or 0) < 0:  # clip_range_high may be None
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ConfigError(f"gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0 (rollouts sample), got {self.temperature}")
        if self.reward_clip is not None and not self.reward_clip > 0:
            raise ConfigError(f"reward_clip must be > 0 or null, got {self.reward_clip}")
        if self.missing_eos_penalty is not None and self.missing_eos_penalty < 0:
            raise ConfigError(f"missing_eos_penalty must be >= 0 or null, got {self.missing_eos_penalty}")
        if not self.kl_target > 0:
            raise ConfigError(f"kl_target must be > 0, got {self.kl_target}")
        if self.algo != "ppo" and self.group_size < 2:
            raise ConfigError(f"algo={self.algo} compares responses within a group: group_size must be >= 2")
        if self.zero_stage == 3:
            raise ConfigError("ppo samples rollouts from the whole policy on every process: use "
                              "zero_stage 0, 1 or 2")
        if self.rollout_size % self.micro_batch_size:
            raise ConfigError(
                f"a rollout of {self.rollout_size} responses does not split into minibatches of "
                f"micro_batch_size={self.micro_batch_size}; make prompts_per_rollout"
                f"{' × group_size' if self.algo != 'ppo' else ''} a multiple of it")
        per_pass = self.rollout_size // self.micro_batch_size
        if per_pass % self.grad_accum:
            raise ConfigError(
                f"grad_accum={self.grad_accum} does not divide the {per_pass} micro-batches of one "
                f"pass over a rollout ({self.rollout_size} responses / micro_batch_size="
                f"{self.micro_batch_size}): an optimizer step would mix two passes; use a grad_accum "
                f"that divides {per_pass}, or change prompts_per_rollout or micro_batch_size")
        self._refuse_settings_of_the_other_algo()

    def _refuse_settings_of_the_other_algo(self) -> None:
        """A setting the chosen algo never reads is an error, not silently ignored ("set" here:
        different from its default)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        unused = [name for name, algos in self.READ_ONLY_BY.items()
                  if self.algo not in algos and getattr(self, name) != defaults[name]]
        if unused:
            readers = sorted({algo for name in unused for algo in self.READ_ONLY_BY[name]})
            raise ConfigError(f"algo={self.algo} ignores {', '.join(f'{n}={getattr(self, n)!r}' for n in unused)}"
                              f" (only {' and '.join(f'algo={a}' for a in readers)} read them): remove them, "
                              f"or use {' or '.join(f'algo={a}' for a in readers)}")

    @property
    def samples_per_prompt(self) -> int:
        return 1 if self.algo == "ppo" else self.group_size

    @property
    def rollout_size(self) -> int:
        """Responses sampled per rollout batch."""
        return self.prompts_per_rollout * self.samples_per_prompt


class PpoTask(Task):
    """PPO / GRPO / RLOO as a task of the shared engine.

    `next_batch` serves minibatches of the current rollout and, when none is left, samples a new
    rollout from the current policy: `prompts_per_rollout` prompts (× group_size for grpo, rloo)
    in a seeded shuffled order, responses sampled with the KV cache, scored, and turned into
    advantages. Each rollout is used for `ppo_epochs` shuffled passes. `loss` is the clipped
    policy loss plus the clipped value loss (ppo) or the k3 KL to the reference (grpo), or that of
    whole responses alone (rloo), plus the MoE load-balancing loss. The engine takes grad_accum
    batches per optimizer step and the config makes that divide the micro-batches of a pass, so no
    step mixes two rollouts or passes; dapo's loss is a mean over the response tokens of the step
    (`items_in_batch`).

    Resume: the prompt position, β and reward statistics are checkpointed; a run resumed from a
    checkpoint taken mid-rollout starts the next rollout (exact when save_every is a multiple of
    the optimizer steps per rollout).
    """

    perplexity = False  # a policy-gradient loss: exp(val_loss) is no perplexity

    def __init__(self, model: ActorCritic, reference: Transformer | None, prompts: list[Prompt],
                 scorer: Scorer, cfg: PpoConfig, *, stop_ids: list[int], pad_id: int,
                 decode: Callable[[list[int]], str]):
        super().__init__(model)
        if not prompts:
            raise ValueError("PPO needs at least one prompt")
        # None: the policy's own frozen base is the reference (LoRA: its adapters disabled)
        self.reference = reference.eval().requires_grad_(False) if reference is not None else None
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
        self._rollout_kl_coef = self.kl_ctl.value  # β of the current rollout's rewards / KL loss
        self._rollout_metrics: dict = {}

    # -- batches --------------------------------------------------------------------------------

    def next_batch(self, model):
        if not self._pending:
            rollout = self.make_rollout(getattr(model, "module", model))
            self._start_rollout(rollout)
        return select_rows(self._rollout, self._pending.pop(0))

    def items_in_batch(self, batch) -> int | None:
        if self.cfg.algo == "grpo" and self.cfg.loss_type == "dapo":
            return int(batch["response_mask"].sum())
        return None

    def _start_rollout(self, rollout: dict) -> None:
        cfg = self.cfg
        n, size = len(rollout["input_ids"]), cfg.micro_batch_size
        self._rollout = rollout
        self._pending = [rows for _ in range(cfg.ppo_epochs) for rows in torch.randperm(n).split(size)]

    def _next_prompts(self) -> list[Prompt]:
        """This process's prompts of the next rollout, each repeated samples_per_prompt times.
        All processes walk one seeded order and each takes its own slice of every block."""
        rank, world = rank_and_world()
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

    def sample(self, policy: Transformer, prompts: list[Prompt]) -> Samples:
        """One response per prompt from `policy`, sampled with the rollout settings."""
        return sample_responses(policy, prompts, max_new_tokens=self.cfg.max_new_tokens,
                                temperature=self.cfg.temperature, stop_ids=self.stop_ids, pad_id=self.pad_id,
                                decode=self.decode, device=self.device or torch.device("cpu"))

    @torch.no_grad()
    def make_rollout(self, module: ActorCritic) -> dict:
        """Sample, score and compute advantages for the next prompts; logs the rollout metrics."""
        cfg = self.cfg
        samples = self.sample(module.policy, self._next_prompts())
        ids, attn, P, mask = (samples.input_ids, samples.attention_mask, samples.prompt_len,
                              samples.response_mask)
        logits, values = module(ids, attn, P)
        # log-probs of the distribution the responses were sampled from (logits / temperature,
        # as TRL does): otherwise the ratio and the KL describe a policy that never sampled them
        logprobs = logprobs_of(logits / cfg.temperature, samples.responses)
        ref_logprobs = self.reference_logprobs(module.policy, ids, attn, P)
        raw_scores = self.scorer(samples).to(logprobs.device, torch.float32)
        stopped = ends_with_stop(samples.responses, mask, self.stop_ids)
        scores = clip_scores(penalize_missing_stop(raw_scores, stopped, cfg.missing_eos_penalty),
                             cfg.reward_clip)
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
        elif cfg.algo == "grpo":
            advantages = self.group_advantages(scores)[:, None] * mask
            if cfg.mask_truncated_completions:  # still scored within their group, not trained on
                rollout["response_mask"] = mask * stopped[:, None].to(mask.dtype)
        else:
            if cfg.mask_truncated_completions:  # as TRL's: scored, but out of the KL and the loss
                mask = rollout["response_mask"] = mask * stopped[:, None].to(mask.dtype)
            rewards = kl_penalized_scores(scores, logprobs, ref_logprobs, mask, self.kl_ctl.value)
            advantages = self.group_advantages(rewards)[:, None]  # one per response: [N, 1]
        rollout["advantages"] = advantages

        self.rollouts_done += 1
        self.reward_history.append(raw_scores.mean().item())
        self._rollout_kl_coef = self.kl_ctl.value
        self._rollout_metrics = {
            "kl": sequence_kl,
            "kl_coef": self._rollout_kl_coef,
            "reward_mean": raw_scores.mean().item(),
            "reward_std": raw_scores.std().item() if len(raw_scores) > 1 else 0.0,
            "response_length": mask.sum(-1).float().mean().item(),
            "rollouts": float(self.rollouts_done),
        }
        # every process's KL and sample count: β must stay the same on every GPU
        pooled_kl, samples_everywhere = mean_over_processes(log_ratio.sum(-1))
        self.kl_ctl.update(pooled_kl, n_steps=samples_everywhere)
        return rollout

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """GRPO's or RLOO's advantages of this process's samples. Groups never straddle processes,
        but scale_rewards=batch and normalize_advantages use every process's, as TRL does."""
        cfg = self.cfg
        if cfg.algo == "rloo":
            return over_processes(functools.partial(
                leave_one_out_advantages, group_size=cfg.group_size, normalize=cfg.normalize_advantages),
                rewards, pooled=cfg.normalize_advantages)
        return over_processes(functools.partial(
            group_relative_advantages, group_size=cfg.group_size, scale=cfg.scale_rewards),
            rewards, pooled=cfg.scale_rewards == "batch")

    def reference_logprobs(self, policy: Transformer, ids, attn, prompt_len: int):
        if self.reference is None:
            with adapters_disabled(policy):
                return response_logprobs(policy, ids, attn, prompt_len, self.cfg.temperature)
        self.reference.to(self.device or "cpu", next(policy.parameters()).dtype)
        return response_logprobs(self.reference, ids, attn, prompt_len, self.cfg.temperature)

    # -- loss -----------------------------------------------------------------------------------

    def loss(self, model, batch):
        cfg = self.cfg
        mask = batch["response_mask"]
        logits, values = model(batch["input_ids"], batch["attention_mask"], batch["prompt_len"])
        logits = logits / cfg.temperature  # the sampling distribution, as in make_rollout
        logprobs = logprobs_of(logits, batch["input_ids"][:, batch["prompt_len"]:])
        entropy = masked_mean(entropy_from_logits(logits if cfg.entropy_coef else logits.detach()),
                              mask)
        metrics = {"entropy": entropy.detach(),
                   "approx_kl_old": masked_mean(batch["logprobs"] - logprobs.detach(), mask)}
        if cfg.algo == "rloo":  # no KL term: the KL is in the rewards
            policy_loss, was_clipped = sequence_clipped_policy_loss(
                logprobs, batch["logprobs"], batch["advantages"][:, 0], mask, cfg.clip_range, cfg.clip_range_high)
            loss, metrics["clipfrac"] = policy_loss, was_clipped.float().mean()
        else:
            per_token, was_clipped = clipped_policy_token_loss(
                logprobs, batch["logprobs"], batch["advantages"], cfg.clip_range, cfg.clip_range_high)
            metrics["clipfrac"] = masked_mean(was_clipped.float(), mask)
        if cfg.algo == "ppo":
            policy_loss = masked_mean(per_token, mask)
            value_loss, value_clipfrac = clipped_value_loss(
                values, batch["values"], batch["returns"], mask, cfg.clip_range_value)
            loss = policy_loss + cfg.vf_coef * value_loss
            metrics.update(value_loss=value_loss.detach(), value_clipfrac=value_clipfrac)
        elif cfg.algo == "grpo":
            aggregate = functools.partial(
                aggregate_token_loss, mask=mask, loss_type=cfg.loss_type, max_tokens=cfg.max_new_tokens,
                # a batch not served by next_batch is an optimizer step of its own
                tokens_per_micro_batch=batch.get(ITEMS_PER_MICRO_BATCH, mask.sum()))
            policy_loss = aggregate(per_token)
            kl = kl_estimate(logprobs, batch["ref_logprobs"], "k3")
            if cfg.kl_bias_correction:  # the ratio is differentiable: it changes the gradient at ρ = 1 too
                kl = kl * torch.exp(logprobs - batch["logprobs"])
            kl_loss = aggregate(kl)
            # the aggregation is linear: this is TRL's aggregate of (surrogate + β·k3) per token,
            # with the β this rollout logged (adaptive_kl moves it between rollouts)
            loss = policy_loss + self._rollout_kl_coef * kl_loss
            metrics["kl_loss"] = kl_loss.detach()
        metrics["policy_loss"] = policy_loss.detach()
        # model.aux_loss: the MoE load-balancing loss of this forward (0 for a dense policy)
        loss = loss - cfg.entropy_coef * entropy + model.aux_loss
        return loss, {**metrics, **self._rollout_metrics}

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


# ---- the stage -----------------------------------------------------------------------------------

def window_mean(values: list[float], first: bool) -> float | None:
    """Mean of the first (or last) tenth of `values`, at least one of them."""
    if not values:
        return None
    k = max(1, len(values) // 10)
    chunk = values[:k] if first else values[-k:]
    return sum(chunk) / len(chunk)


def reward_model_for(rm_step, mode: str, cfg: PpoConfig, tokenizer, rm_art, policy_art):
    """The reward model when the reward or a separate value trunk reads it, else None; it must
    read the policy's tokens."""
    from llmkit.tokenizer import same_tokenizer

    if rm_step is None or (mode == "verify" and cfg.value_model != "separate"):
        return None
    reward_model = load_reward_model(rm_step)
    if not same_tokenizer(tokenizer.path, load_tokenizer(rm_step).path):
        raise UserError(f"{rm_art.path} and {policy_art.path} use different tokenizers; train "
                        "the reward model from the same base as the policy")
    return reward_model


def answers_scorer(cfg: PpoConfig, tokenizer, records: list[dict]):
    """`score(model, dist) -> {"accuracy", "similarity"}` of greedy replies to `records`, on the
    main process alone (the others wait in the engine's setup), for `Fit.score`."""

    def score(model, dist):
        if not dist.is_main:
            return {"accuracy": None, "similarity": None}
        scores = evaluate_answers(model, tokenizer, records, cfg.max_new_tokens)
        return {"accuracy": scores["exact_match"], "similarity": scores["similarity"]}

    return score


def ppo_task(policy: Transformer, cfg: PpoConfig, prompts: list[Prompt], mode: str, tokenizer,
             reward_model=None) -> PpoTask:
    """The task of a run rewarded by `mode` (llmkit.rewards.reward_mode)."""
    scorer = rollout_scorer(mode, reward_model, cfg.verify_weight, cfg.partial_credit)
    # LoRA: the reference is the policy with its adapters disabled, no second copy of the base
    reference = None if adapters_of(policy) is not None else copy.deepcopy(policy)
    return PpoTask(build_actor_critic(policy, cfg, reward_model), reference, prompts, scorer, cfg,
                   stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id, decode=tokenizer.decode)


def ppo_stats(result, task: PpoTask) -> dict:
    return {"rollouts": task.rollouts_done,
            "reward_start": window_mean(task.reward_history, first=True),
            "reward_end": window_mean(task.reward_history, first=False)}


def ppo_summary(s: dict) -> list[tuple]:
    def score(x):  # None: nothing held out, or the process held a ZeRO-3 shard of the policy
        return "n/a" if x is None else f"{x:.3f}"

    return [("rollouts", s["rollouts"]),
            ("reward", f"{s['reward_start']:.3f} -> {s['reward_end']:.3f} ({s['reward']})"),
            ("held-out exact match", f"{score(s['base_accuracy'])} -> {score(s['accuracy'])} "
                                     f"({s['eval_records']} rows)"),
            ("held-out similarity", f"{score(s['base_similarity'])} -> {score(s['similarity'])}")]


def run_ppo(ctx, cfg: PpoConfig, policy: str = "sft", reward_model: str | None = None, eval_data=None):
    """`llmkit ppo`: PPO, GRPO or RLOO of checkpoint `policy` on the prompts of --in (prompts_train)."""
    policy_art, start, prompts_art, eval_art = post_training_inputs(ctx, "ppo", cfg, policy, eval_data)
    rm_art, rm_step = starting_weights(ctx.workspace, reward_model) if reward_model else (None, None)
    mode = reward_mode(cfg.reward, rm_art is not None)

    def prepare() -> Fit:
        model, tokenizer = load_start(start, cfg)
        rm = reward_model_for(rm_step, mode, cfg, tokenizer, rm_art, policy_art)
        train_rows, heldout = heldout_split(prompts_art, eval_art, cfg)
        prompts, dropped = rollout_prompts(tokenizer, train_rows, cfg.seq_len - cfg.max_new_tokens,
                                           prompts_art.path, needs_answer=mode != "model")
        scored = [r for r in heldout if r.get("answer") is not None][:cfg.eval_records]
        return Fit(lambda dist: ppo_task(model, cfg, prompts, mode, tokenizer, rm), tokenizer.path, ppo_summary,
                   model=model, start=start, model_config=model.config, after=ppo_stats,
                   score=answers_scorer(cfg, tokenizer, scored), metrics={"kl": "kl"},
                   stats={"reward": mode, "algo": cfg.algo, "train_prompts": len(prompts), "dropped_too_long":
                          dropped, "heldout_rows": len(heldout), "eval_records": len(scored)})

    return fit_stage(ctx, "ppo", cfg, [policy_art, prompts_art, rm_art, eval_art], prepare)
