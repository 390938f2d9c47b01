"""What `--dry-run` of a training stage shares: each trainer's `plan_<stage>` (beside its
`run_<stage>`, reading the same inputs the run reads: `post_training_inputs`, `run_start`) opens
its inputs and prints what the run would do; `llmkit.dryrun` does the arithmetic. Nothing is
written: no artifact, lock or work folder.

The world size is the launcher's (`WORLD_SIZE`, which torchrun and deepspeed set), so
`WORLD_SIZE=8 llmkit pretrain --dry-run` plans a run on 8 devices.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from llmkit.checkpoints.step_folders import MODEL_CONFIG, read_latest
from llmkit.dryrun import Shape, head_parameters, lora_parameters, parameters
from llmkit.errors import ConfigError
from llmkit.model.config import extended_max_seq_len
from llmkit.train.posttrain import post_training_inputs


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def dense_attention_mask() -> bool:
    """Whether masked attention (packed or padded batches) builds a dense mask: on CPU, or
    when LLMKIT_ATTENTION=dense (see llmkit.model.transformer)."""
    kernel = os.environ.get("LLMKIT_ATTENTION", "auto")
    if kernel != "auto":
        return kernel == "dense"
    import torch

    return not torch.cuda.is_available()


def model_shape(step_dir: Path):
    config = json.loads((Path(step_dir) / MODEL_CONFIG).read_text(encoding="utf-8"))
    return Shape.of(config), config


def trunk_parameters(step_dir: Path) -> int:
    """Parameters of a checkpoint's model; a reward model has a score head, not an LM head."""
    shape, config = model_shape(step_dir)
    if config.get("llmkit_head") == "reward":
        return parameters(shape) - head_parameters(shape) + shape.hidden_size
    return parameters(shape)


def existing_run(ctx, stage: str) -> list[str]:
    run = ctx.workspace.path(ctx.out_name(stage))
    latest = read_latest(run)
    return [f"run folder          {run} holds {latest}: a run continues from there "
            "(or is up to date)"] if latest else []


def rows_of(artifact) -> int | None:
    return artifact.stats.get("rows_out")


def show(ctx, plan) -> None:
    plan.notes += existing_run(ctx, plan.stage)
    if int(os.environ.get("RANK", "0")) == 0:
        print("\n".join(plan.lines()))


def check_seq_len(cfg, max_seq_len: int, how: str) -> None:
    """The run's own check, made before it would start: the dry run exits 2 as the run would."""
    if cfg.seq_len > max_seq_len:
        raise ConfigError(f"seq_len={cfg.seq_len} exceeds the model's max_seq_len={max_seq_len}; {how}")


def post_training_plan(ctx, stage: str, cfg, base: str, eval_data: str | None):
    """(start step folder, notes, data artifact, --eval artifact) of a post-training stage's plan:
    the inputs its run would open (`post_training_inputs`), the seq_len check it would make."""
    _, step_dir, data_art, eval_art = post_training_inputs(ctx, stage, cfg, base, eval_data)
    rows = rows_of(data_art)
    held = (f"--eval {eval_art.path}" if eval_art is not None
            else f"{cfg.eval_fraction:.0%} of them held out")
    notes = [f"start               {step_dir}",
             f"input               {data_art.path}: {rows:,} rows ({held})" if rows is not None
             else f"input               {data_art.path}"]
    max_seq_len = extended_max_seq_len(model_shape(step_dir)[1]["max_seq_len"], cfg.model)  # --set model.rope_scaling
    check_seq_len(cfg, max_seq_len, f"use --set seq_len={max_seq_len}")
    return step_dir, notes, data_art, eval_art


def lora_split(shape, n: int, cfg) -> tuple[int, int]:
    """(trained parameters, frozen base parameters) of a model of `n` parameters: all trained and
    no frozen base, or under LoRA (`lora.r` > 0) the adapters trained and the `n` weights frozen."""
    if not cfg.lora.enabled:
        return n, 0
    return lora_parameters(shape, cfg.lora.r, cfg.lora.target), n
