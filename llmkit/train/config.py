"""The engine's settings (`TrainConfig`, flat in every trainer's config: `--set lr=…`) and the
learning-rate schedule they describe."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar

from llmkit.checkpoints import step_folders as ckpt
from llmkit.errors import ConfigError
from llmkit.core.executor import RUN_OPTION
from llmkit.checkpoints.lora import LoraConfig
from llmkit.train.cpu_precision import trained_precision
from llmkit.train.gate import GateConfig
from llmkit.train.replay import ReplayConfig

PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "adamw8bit", "paged_adamw", "paged_adamw8bit")  # see llmkit.train.optim
LR_SCHEDULES = ("cosine", "wsd", "constant")
DECAY_SHAPES = ("linear", "sqrt", "cosine")


@dataclass
class TrainConfig:
    max_steps: int = 1000  # optimizer steps of the whole run
    micro_batch_size: int = 8  # sequences per forward pass, per process
    grad_accum: int = 1  # micro-batches accumulated into one optimizer step
    lr: float = 3e-4  # peak learning rate, reached at the end of warmup
    min_lr: float = 3e-5  # learning rate at the end of the decay
    warmup_steps: int | None = None  # linear warmup from 0 to lr; None = 100 steps, or 10% of a shorter run
    lr_schedule: str = "cosine"  # after warmup: cosine (to min_lr at max_steps) | wsd (lr held, then the decay of decay_steps) | constant
    decay_steps: int | None = None  # wsd: the final decay's length; None = 20% of the steps after warmup
    decay_shape: str = "linear"  # wsd: how the decay falls to min_lr: linear | sqrt (1 - sqrt(progress)) | cosine
    weight_decay: float = 0.1  # AdamW decay of matrices (norms and biases are not decayed)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW moment coefficients
    optim: str = "adamw"  # adamw | adamw8bit (8-bit states, bitsandbytes) | paged_adamw | paged_adamw8bit (GPU)
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 disables clipping
    precision: str = "fp32"  # fp32 | bf16 | fp16 (GPU only; dynamic loss scale from 2^14)
    zero_stage: int = 0  # DeepSpeed ZeRO stage: 0 none, 1 optimizer, 2 +gradients, 3 +parameters
    offload_optimizer: bool = False  # ZeRO >= 1: optimizer state in CPU memory
    offload_params: bool = False  # ZeRO 3: parameters in CPU memory
    activation_checkpointing: bool = False  # recompute activations in backward (less memory, ~30% slower)
    compile: bool = False  # torch.compile the model
    save_every: int = 1000  # checkpoint every N steps and at the end; 0 = only at the end
    keep_last: int = 3  # complete checkpoints kept (older ones are pruned); 0 keeps all
    eval_every: int = 0  # validate every N steps and at the end; 0 = never
    eval_batches: int = 20  # micro-batches per validation, per process
    log_every: int = 10  # write metrics every N steps (and at the last step)
    seed: int = 0  # seeds python/numpy/torch at the start of a fresh run
    max_bad_steps: int = 10  # stop after this many consecutive skipped (NaN/Inf) steps
    resume_from: str | None = None  # step folder to resume from; None = the newest complete one
    peak_flops: float | None = None  # per-device peak FLOP/s for MFU; None = GPU table / measured CPU
    threads: int = field(default=0, metadata=RUN_OPTION)  # CPU threads; 0 = this process's free cores, followed during the run (OMP_NUM_THREADS wins)
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA adapters (lora.r > 0): train those, the weights stay frozen
    replay: ReplayConfig = field(default_factory=ReplayConfig)  # general data mixed into the batches (llmkit.train.replay)
    gate: GateConfig = field(default_factory=GateConfig, metadata=RUN_OPTION)  # held-out general evaluations the run must keep (llmkit.train.gate)

    # settings a run may change when it is continued (`checkpoint.plan_run`): how far, how fast
    # and how observed it goes on. The rest (batch shape, precision, ZeRO stage, seed, optimizer
    # moments) is baked into its checkpoints, data position or DeepSpeed shards.
    CONTINUABLE: ClassVar[frozenset] = frozenset({
        "max_steps", "lr", "min_lr", "warmup_steps", "lr_schedule", "decay_steps", "decay_shape",
        "grad_clip", "save_every", "keep_last", "eval_every", "eval_batches", "log_every",
        "max_bad_steps", "resume_from", "peak_flops", "compile", "activation_checkpointing", "threads",
        *(f"gate.{k}" for k in GateConfig.__dataclass_fields__)})

    AUTO_WARMUP: ClassVar[int] = 100  # the warmup that warmup_steps=None gives a long enough run

    def __post_init__(self):
        self.betas = tuple(self.betas)
        if self.warmup_steps is None:  # left at its default: never longer than the run itself
            auto = type(self).AUTO_WARMUP
            self.warmup_steps = auto if auto <= self.max_steps else self.max_steps // 10
        positive = ("max_steps", "micro_batch_size", "grad_accum", "eval_batches", "log_every",
                    "max_bad_steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "save_every", "keep_last", "eval_every", "weight_decay",
                     "grad_clip", "min_lr", "threads"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if self.min_lr > self.lr:
            raise ConfigError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        if self.warmup_steps > self.max_steps:
            raise ConfigError(f"warmup_steps ({self.warmup_steps}) exceeds max_steps ({self.max_steps})")
        self._check_schedule()
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"betas must be two numbers in [0, 1), got {list(self.betas)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.optim not in OPTIMIZERS:
            raise ConfigError(f"optim must be one of {', '.join(OPTIMIZERS)}, got {self.optim!r}")
        if self.zero_stage == 3 and self.lora.quantized:
            raise ConfigError(f"lora.quant={self.lora.quant} with zero_stage=3: ZeRO-3 cuts every parameter "
                              "into flat shards, and a quantised weight's packed bytes mean nothing without "
                              "its per-block scales, which ZeRO does not carry; use zero_stage 0-2 (they "
                              "shard the adapters' gradients and optimizer state), or lora.quant=none")
        if self.lora.enabled and self.lora.base_products == "bf16" and self.precision != "fp32":
            raise ConfigError(f"lora.base_products=bf16 gives an fp32 run's frozen base bf16 products; with "
                              f"precision={self.precision} every weight computes in it already: set one of them")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ConfigError("offload_optimizer needs zero_stage >= 1")
        if self.offload_params and self.zero_stage != 3:
            raise ConfigError("offload_params needs zero_stage 3")
        if self.resume_from is not None and ckpt.STEP_DIR.match(self.resume_from) is None:
            raise ConfigError(f"resume_from must name a step folder like 'step-00001000', "
                              f"got {self.resume_from!r}")
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise ConfigError(f"peak_flops must be > 0 or null, got {self.peak_flops}")

    def _check_schedule(self) -> None:
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        if self.decay_shape not in DECAY_SHAPES:
            raise ConfigError(f"decay_shape must be one of {', '.join(DECAY_SHAPES)}, got {self.decay_shape!r}")
        if self.decay_steps is not None and not 1 <= self.decay_steps <= self.max_steps - self.warmup_steps:
            raise ConfigError(f"decay_steps must be between 1 and max_steps - warmup_steps "
                              f"({self.max_steps - self.warmup_steps}), got {self.decay_steps}")

    @property
    def torch_dtype(self):
        """The dtype the engine trains the weights in (DeepSpeed casts the model to it): fp32 for
        bf16 on a CPU without the bf16 instructions (`cpu_precision.trained_precision`)."""
        import torch

        return {"fp32": torch.float32, "bf16": torch.bfloat16,
                "fp16": torch.float16}[trained_precision(self.precision)]

    def train_config(self) -> TrainConfig:
        """The engine's settings alone, from a trainer's config that extends them."""
        return TrainConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(TrainConfig)})


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warmup, then `cfg.lr_schedule`."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if cfg.lr_schedule == "cosine":
        progress = (step - cfg.warmup_steps) / max(cfg.max_steps - cfg.warmup_steps, 1)
        return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))) * (cfg.lr - cfg.min_lr)
    # warmup-stable-decay: the decay is the run's last decay_steps, so a run continued with a
    # later max_steps (CONTINUABLE) stays at lr until its new end comes near, and a stable
    # checkpoint continued with max_steps = its step + decay_steps decays from there
    decay = cfg.decay_steps or max(1, round(0.2 * (cfg.max_steps - cfg.warmup_steps)))
    progress = min(max(step - (cfg.max_steps - decay), 0) / decay, 1.0)
    kept = {"linear": 1 - progress, "sqrt": 1 - math.sqrt(progress),
            "cosine": 0.5 * (1 + math.cos(math.pi * progress))}[cfg.decay_shape]
    return cfg.min_lr + kept * (cfg.lr - cfg.min_lr)
