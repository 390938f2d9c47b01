"""The settings of `llmkit ppo` (PPO, GRPO, RLOO; the algorithms are described in `llmkit.train.ppo`):
which settings each algo reads, and the refusals of combinations that would silently do nothing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from llmkit.errors import ConfigError
from llmkit.model.decode_weights import DecodeConfig
from llmkit.rewards.plugins import reward_names, reward_weights
from llmkit.rewards.text import format_reward_of
from llmkit.rewards.tools import tool_names
from llmkit.train.grpo_losses import CLIPPED_SURROGATE_LOSSES, GrpoLossType, ImportanceSamplingLevel
from llmkit.train.rl_losses import RewardScaling
from llmkit.train.posttrain import GenerativeConfig


SAPO_SETTINGS = ("sapo_temperature_pos", "sapo_temperature_neg")
VESPO_SETTINGS = ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")


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
        **dict.fromkeys(("loss_type", "scale_rewards", "kl_bias_correction", "importance_sampling_level",
                         "ratio_max", *SAPO_SETTINGS, *VESPO_SETTINGS), ("grpo",)),
        "mask_truncated_completions": ("grpo", "rloo"), "normalize_advantages": ("rloo",),
        # tool turns leave holes in the response mask, which ppo's GAE would bootstrap across
        **dict.fromkeys(("tools", "max_tool_turns", "tool_timeout"), ("grpo", "rloo"))}

    algo: Literal["ppo", "grpo", "rloo"] = "ppo"  # grpo, rloo: advantages within a group of samples, no value model
    # auto: the reward model if one is given, else verify; mix: model + verify_weight × verify; or
    # rewards comma-separated (llmkit.rewards.plugins): verify, format, math, code, model (--reward
    # RM), FILE.py:FUNCTION (a function with TRL's reward signature), summed with reward_weights
    reward: str = "auto"
    reward_weights: list[float] | None = None  # one weight per named reward (TRL's reward_weights); None = 1 each
    reward_format: str | None = None  # reward format: the regex a whole completion must match; None = <think>…</think> then the answer (TRL's think_format_reward)
    verify_weight: float = 1.0  # mix: score = reward-model score + verify_weight × verifiable reward
    partial_credit: bool = False  # verifiable reward of a wrong response: its similarity to the answer (1 − edit distance / length), not 0
    prompts_per_rollout: int = 16  # prompts sampled per rollout batch
    group_size: int = 4  # grpo, rloo: responses sampled per prompt (ppo samples one)
    ppo_epochs: int = 2  # passes over each rollout batch, in minibatches of micro_batch_size
    # rollouts sample the whole distribution (no top-k / top-p, as TRL's): the ratio's
    # log-probs are those of logits / temperature, so a truncated sampler would be off-policy
    temperature: float = 1.0  # sampling temperature of rollouts
    clip_range: float = 0.2  # ε: the policy ratio is clipped to [1 − ε, 1 + ε_high]
    clip_range_high: float | None = None  # ε_high (DAPO's clip-higher, TRL's epsilon_high; DAPO uses 0.28; cispo: the cap of ρ itself, ScaleRL uses 5.0); None = clip_range
    # grpo: the policy loss and how per-token losses become one (TRL's loss_type and its default;
    # llmkit.train.grpo_losses): grpo = mean of each sequence's token mean (the paper), bnpo =
    # token mean of the micro-batch, dr_grpo = token sum / (sequences × max_new_tokens), dapo =
    # token mean over the whole optimizer step (every micro-batch and process); cispo (clipped,
    # detached IS weight × log π), sapo (a soft sigmoid gate for the clip), vespo (a smooth weight
    # of the response's ratio) and luspo (sum per sequence) change the loss itself. ppo keeps the
    # token mean of the micro-batch, as TRL's PPOTrainer and OpenRLHF (token_level_loss) do.
    loss_type: GrpoLossType = "dapo"
    importance_sampling_level: ImportanceSamplingLevel = "token"  # grpo: ρ per token, or one per response (sequence: GSPO, exp of the mean token log-ratio)
    ratio_max: float | None = None  # grpo clipped losses: ρ capped at this before the clip also for A < 0 (INTELLECT-2's two-sided clip, TRL's delta; > 1 + clip_range_high)
    sapo_temperature_pos: float = 1.0  # sapo: τ of the soft gate where the advantage is > 0
    sapo_temperature_neg: float = 1.05  # sapo: τ where the advantage is <= 0
    vespo_k_pos: float = 2.0  # vespo: power k of φ(w) = e^λ·w^k·e^(−λw) where the advantage is >= 0
    vespo_lambda_pos: float = 3.0  # vespo: decay λ where the advantage is >= 0
    vespo_k_neg: float = 3.0  # vespo: k where the advantage is < 0
    vespo_lambda_neg: float = 2.0  # vespo: λ where the advantage is < 0
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
    tools: str | None = None  # grpo, rloo: tools the policy may call in a rollout (llmkit.train.tool_rollouts): calculator, FILE.py:FUNCTION[,FUNCTION]
    max_tool_turns: int = 3  # rounds of tool calls per rollout before the reply is the answer
    tool_timeout: float = 5.0  # seconds one tool call may run before it returns an error
    # decode.weights=bf16|f16|int8: the rollouts' sampling multiplies by low-precision copies of the
    # policy's weights on CPU (llmkit.model.decode_weights); the old and reference log-probs, the KL
    # and the losses stay fp32, and so does the held-out evaluation
    decode: DecodeConfig = field(default_factory=DecodeConfig)
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
        if self.tools:
            tool_names(self.tools)  # an unknown built-in is refused here
        if self.max_tool_turns < 0 or not self.tool_timeout > 0:
            raise ConfigError(f"max_tool_turns must be >= 0 and tool_timeout > 0, got "
                              f"{self.max_tool_turns}, {self.tool_timeout}")
        self._refuse_settings_of_another_loss()
        names = reward_names(self.reward, has_reward_model=True)  # an unknown name is refused here
        reward_weights(names, self.reward, self.reward_weights, self.verify_weight)
        if self.reward_format is not None:
            if "format" not in names:
                raise ConfigError(f"reward_format is read by the format reward alone; add format to reward={self.reward}")
            format_reward_of(self.reward_format)  # a bad regex is refused here

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

    def _refuse_settings_of_another_loss(self) -> None:
        """GRPO's loss-specific settings only with their loss_type, and the combinations TRL warns
        about that would not do what they say."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        readers = {**dict.fromkeys(SAPO_SETTINGS, ("sapo",)), **dict.fromkeys(VESPO_SETTINGS, ("vespo",)),
                   "ratio_max": CLIPPED_SURROGATE_LOSSES}
        unused = [n for n, losses in readers.items()
                  if self.loss_type not in losses and getattr(self, n) != defaults[n]]
        if unused:
            them = "it" if len(unused) == 1 else "them"
            losses = ", ".join(sorted({loss for name in unused for loss in readers[name]}))
            raise ConfigError(f"loss_type={self.loss_type} ignores {', '.join(unused)}: remove {them}, "
                              f"or use the loss_type that reads {them} ({losses})")
        if self.loss_type == "cispo" and self.clip_range_high is None:
            # TRL caps ρ at epsilon_high itself, which defaults to epsilon (0.2): nearly every
            # token's weight would be 0.2, a scaled REINFORCE rather than CISPO
            raise ConfigError("loss_type=cispo caps the importance weight at clip_range_high (not 1 + it); "
                              "set it, e.g. clip_range_high=5.0 (ScaleRL's), clip_range_high=0.2 for TRL's default")
        if self.loss_type == "vespo" and self.importance_sampling_level != "token":
            raise ConfigError("loss_type=vespo weighs whole responses itself: leave importance_sampling_level=token")
        for name in (*SAPO_SETTINGS, "vespo_lambda_pos", "vespo_lambda_neg", "ratio_max"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def samples_per_prompt(self) -> int:
        return 1 if self.algo == "ppo" else self.group_size

    @property
    def steps_per_rollout(self) -> int:
        """Optimizer steps over one rollout (every pass)."""
        return self.ppo_epochs * self.rollout_size // (self.micro_batch_size * self.grad_accum)

    @property
    def rollout_size(self) -> int:
        """Responses sampled per rollout batch."""
        return self.prompts_per_rollout * self.samples_per_prompt
