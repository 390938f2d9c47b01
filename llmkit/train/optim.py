"""What the engine hands `deepspeed.initialize`: the optimizer and DeepSpeed's config.

`optim` picks the optimizer of every trainer (full fine-tuning and LoRA alike): torch's fused
AdamW, or bitsandbytes' AdamW with 8-bit states (`adamw8bit`: both moments blockwise-quantised,
2 bytes per parameter instead of 8; tensors under 4,096 elements keep 32-bit states, as
bitsandbytes does) and its paged variants (states in CUDA unified memory, paged out to CPU
memory under pressure: GPU only).
"""

from __future__ import annotations

import math

from llmkit.errors import ConfigError
from llmkit.train.config import OPTIMIZERS, TrainConfig
from llmkit.model.quant import import_bitsandbytes

BITSANDBYTES_OPTIMIZERS = {"adamw8bit": "AdamW8bit", "paged_adamw": "PagedAdamW",
                           "paged_adamw8bit": "PagedAdamW8bit"}
assert set(BITSANDBYTES_OPTIMIZERS) | {"adamw"} == set(OPTIMIZERS)
# a parameter carrying this attribute (True) is not decayed, matrix or not: decay would move rows
# that are meant to stay as they are (llmkit.train.new_rows_only)
NO_DECAY = "llmkit_no_weight_decay"


def check_optimizer_runs(cfg: TrainConfig, on_gpu: bool) -> None:
    """A ConfigError naming `optim` when this device (or offload) cannot run it."""
    if cfg.optim.startswith("paged_") and not on_gpu:
        raise ConfigError(f"optim={cfg.optim} pages its state between GPU and CPU memory (CUDA unified "
                          "memory), and this run has no GPU; use optim=adamw8bit (8-bit states on CPU) "
                          "or optim=adamw")
    if cfg.optim != "adamw" and cfg.offload_optimizer and on_gpu:
        raise ConfigError(f"optim={cfg.optim} with offload_optimizer: DeepSpeed steps an offloaded "
                          "optimizer with its own CPU Adam (32-bit states); drop offload_optimizer, or "
                          "use optim=adamw")


def optimizer_class(name: str):
    """The optimizer class `optim` names."""
    import torch

    if name == "adamw":
        return torch.optim.AdamW

    return getattr(import_bitsandbytes().optim, BITSANDBYTES_OPTIMIZERS[name])


def guarded_adamw(base=None):
    import torch

    base = base or torch.optim.AdamW

    class GuardedAdamW(base):
        """AdamW that clips the global gradient norm itself and skips a step whose gradients hold
        NaN/Inf. DeepSpeed's ZeRO and mixed-precision optimizers do both; its plain fp32 path
        does neither, so the engine gives it this one (DeepSpeed reads `overflow` to count skips).
        """

        def __init__(self, params, max_norm: float, **kwargs):
            super().__init__(params, **kwargs)
            self.max_norm = max_norm
            self.overflow = False
            self._global_grad_norm = None

        @torch.no_grad()
        def step(self, closure=None):
            params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            self._global_grad_norm = float(norm)
            self.overflow = not math.isfinite(self._global_grad_norm)
            if self.overflow:
                return None
            if 0 < self.max_norm < self._global_grad_norm:  # below it the scale is exactly 1
                torch.nn.utils.clip_grads_with_norm_(params, self.max_norm, norm)
            return super().step(closure)

    return GuardedAdamW


def make_optimizer(model, cfg: TrainConfig, on_gpu: bool, guarded: bool):
    """AdamW (`cfg.optim`) over the trainable parameters, matrices decayed and the rest (and NO_DECAY) not:
    DeepSpeed's CPU Adam when the optimizer is offloaded from a GPU, else torch's fused one or
    bitsandbytes' (the guarded kind when DeepSpeed neither clips nor checks for overflow)."""
    import torch

    check_optimizer_runs(cfg, on_gpu)
    params = [p for p in model.parameters() if p.requires_grad]
    decayed = [p.dim() >= 2 and not getattr(p, NO_DECAY, False) for p in params]
    groups = [{"params": [p for p, d in zip(params, decayed) if d], "weight_decay": cfg.weight_decay},
              {"params": [p for p, d in zip(params, decayed) if not d], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    kwargs = dict(lr=cfg.lr, betas=cfg.betas, eps=1e-8)
    if cfg.offload_optimizer and on_gpu:
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # C++ op, built on first use

        return DeepSpeedCPUAdam(groups, adamw_mode=True, **kwargs)
    if cfg.optim != "adamw":
        cls = optimizer_class(cfg.optim)
        if guarded:
            return guarded_adamw(cls)(groups, max_norm=cfg.grad_clip, **kwargs)
        return cls(groups, **kwargs)
    # fused: one kernel per step instead of ~10 passes over the weights (9x faster on CPU)
    if guarded:
        return guarded_adamw()(groups, max_norm=cfg.grad_clip, fused=True, **kwargs)
    return torch.optim.AdamW(groups, fused=True, **kwargs)


def deepspeed_config(cfg: TrainConfig, on_gpu: bool, guarded: bool) -> dict:
    """DeepSpeed's config dict for these settings."""
    zero: dict = {"stage": cfg.zero_stage}
    pin = on_gpu  # pinned host memory only where there is a GPU to copy to
    if cfg.zero_stage >= 1:
        # gradients reduced in 200M-element buckets as backward produces them, on their own
        # CUDA stream (overlap_comm), into one contiguous buffer: DeepSpeed's defaults reduce
        # after backward in 500M buckets, which both serialises the communication and holds
        # more memory
        zero.update(overlap_comm=pin, contiguous_gradients=True, reduce_scatter=True,
                    reduce_bucket_size=200_000_000, allgather_bucket_size=200_000_000)
    if cfg.zero_stage == 3:
        # prefetch the next layers' weights while this one computes; keep parameters under
        # 100k elements (norms, biases) whole on every rank instead of gathering them each time
        zero.update(stage3_prefetch_bucket_size=50_000_000,
                    stage3_param_persistence_threshold=100_000)
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if cfg.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    ds = {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": cfg.grad_accum,
        "gradient_clipping": 0.0 if guarded else cfg.grad_clip,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }
    if cfg.precision == "bf16":
        ds["bf16"] = {"enabled": True, "check_grad_overflow": True}
    elif cfg.precision == "fp16":
        ds["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 14,
                      "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
    return ds
