"""`--dry-run` of the training stages: resolve the config, open the inputs the run would read (as
the trainer does: `ctx.input`, `starting_weights`, `tokenizer_of`) and print what the run would
do — `llmkit.dryrun` does the arithmetic. Nothing is written: no artifact, lock or work folder.

The world size is the launcher's (`WORLD_SIZE`, which torchrun and deepspeed set), so
`WORLD_SIZE=8 llmkit pretrain --dry-run` plans a run on 8 devices.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

DryRun = Annotated[bool, typer.Option(
    "--dry-run", help="Print what the run would do (parameters, tokens, steps, memory per device, "
                      "checkpoint size) and exit without writing anything.")]


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def dense_attention_mask() -> bool:
    """Whether masked attention (packed or padded batches) builds a dense mask: on CPU, or
    when LLMKIT_ATTENTION=dense (see llmkit.model)."""
    kernel = os.environ.get("LLMKIT_ATTENTION", "auto")
    if kernel != "auto":
        return kernel == "dense"
    import torch

    return not torch.cuda.is_available()


def model_shape(step_dir: Path):
    from llmkit.dryrun import Shape
    from llmkit.checkpoints import MODEL_CONFIG

    config = json.loads((Path(step_dir) / MODEL_CONFIG).read_text(encoding="utf-8"))
    return Shape.of(config), config


def trunk_parameters(step_dir: Path) -> int:
    """Parameters of a checkpoint's model; a reward model has a score head, not an LM head."""
    from llmkit.dryrun import head_parameters, parameters

    shape, config = model_shape(step_dir)
    if config.get("llmkit_head") == "reward":
        return parameters(shape) - head_parameters(shape) + shape.hidden_size
    return parameters(shape)


def existing_run(ctx, stage: str) -> list[str]:
    from llmkit.checkpoints import read_latest

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
    from llmkit.errors import ConfigError

    if cfg.seq_len > max_seq_len:
        raise ConfigError(f"seq_len={cfg.seq_len} exceeds the model's max_seq_len={max_seq_len}; {how}")


def plan_pretrain(ctx, cfg, from_: str | None) -> None:
    from llmkit.dryrun import Shape, parameters, plan
    from llmkit.errors import ConfigError
    from llmkit.train.loading import starting_weights
    from llmkit.train.pretrain import tokenizer_of

    tokens_art = ctx.input(default="tokens")
    tokenizer_of(tokens_art, ctx.workspace)  # the run needs it: a missing one is named now
    vocab = tokens_art.manifest["stats"]["vocab_size"]
    if from_ is not None:
        _, step_dir = starting_weights(ctx.workspace, from_)
        shape, config = model_shape(step_dir)
        max_seq_len = config["max_seq_len"]
    else:
        model = cfg.model.build(vocab)
        shape, max_seq_len = Shape.of(model), model.max_seq_len
    n, world = parameters(shape), world_size()
    per_step = cfg.micro_batch_size * cfg.seq_len * cfg.grad_accum * world
    train_tokens = tokens_art.manifest["stats"].get("splits", {}).get("train", {}).get("tokens")
    notes = []
    if train_tokens:
        notes.append(f"input               {tokens_art.path}: {train_tokens:,} training tokens "
                     f"(vocabulary {vocab:,}), read {per_step * cfg.max_steps / train_tokens:.2f} "
                     "times over")
    check_seq_len(cfg, max_seq_len, "set model.max_seq_len or lower seq_len")
    if shape.vocab_size < vocab:
        raise ConfigError(f"the model's vocab_size ({shape.vocab_size}) is smaller than the "
                          f"tokenizer's ({vocab}); drop model.vocab_size or raise it")
    trainable, base = lora_split(shape, n, cfg)
    show(ctx, plan("pretrain", shape, trainable=trainable, total=trainable + base, unit="tokens",
              per_step=per_step, frozen=base, saved=trainable if base else None,
              tokens_per_step=per_step, sequences=cfg.micro_batch_size, seq_len=cfg.seq_len, cfg=cfg,
              world_size=world, chunked_loss=True, notes=notes))


def _post_training(ctx, stage: str, cfg, base: str, data_default: str, eval_data: str | None):
    from llmkit.train.loading import starting_weights

    _, step_dir = starting_weights(ctx.workspace, base)
    data_art = ctx.input(default=data_default)
    eval_art = ctx.workspace.artifact(eval_data) if eval_data else None
    rows = rows_of(data_art)
    held = (f"--eval {eval_art.path}" if eval_art is not None
            else f"{cfg.eval_fraction:.0%} of them held out")
    notes = [f"start               {step_dir}",
             f"input               {data_art.path}: {rows:,} rows ({held})" if rows is not None
             else f"input               {data_art.path}"]
    check_seq_len(cfg, model_shape(step_dir)[1]["max_seq_len"],
                  f"use --set seq_len={model_shape(step_dir)[1]['max_seq_len']}")
    return step_dir, notes


def plan_sft(ctx, cfg, base: str, eval_data: str | None) -> None:
    from llmkit.dryrun import parameters, plan

    step_dir, notes = _post_training(ctx, "sft", cfg, base, "sft_train", eval_data)
    shape, _ = model_shape(step_dir)
    n, world = parameters(shape), world_size()
    sequences = cfg.micro_batch_size * cfg.grad_accum * world
    trainable, base = lora_split(shape, n, cfg)
    show(ctx, plan("sft", shape, trainable=trainable, total=trainable + base, frozen=base,
              saved=trainable if base else None,
              unit="packed sequences" if cfg.packing else "sequences", per_step=sequences, tokens_per_step=sequences * cfg.seq_len,
              sequences=cfg.micro_batch_size, seq_len=cfg.seq_len, cfg=cfg, world_size=world,
              dense_mask=cfg.packing and dense_attention_mask(), notes=notes))


def plan_rm(ctx, cfg, base: str, eval_data: str | None) -> None:
    from llmkit.dryrun import head_parameters, parameters, plan

    step_dir, notes = _post_training(ctx, "rm", cfg, base, "pref_train", eval_data)
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


def plan_dpo(ctx, cfg, base: str, ref: str | None, eval_data: str | None, stage: str = "dpo") -> None:
    """`dpo --dry-run`, and `kto --dry-run` (`stage`): the same models, completions for pairs."""
    from llmkit.data.chat import require_dataset_kind
    from llmkit.dryrun import parameters, plan
    from llmkit.train.dpo import refuse_unused_reference
    from llmkit.train.loading import starting_weights

    refuse_unused_reference(cfg, ref)
    data_default, kind = {"dpo": ("pref_train", "preference"), "kto": ("feedback_train", "feedback")}[stage]
    require_dataset_kind([ctx.input(default=data_default),
                          ctx.workspace.artifact(eval_data) if eval_data else None], kind, stage)
    step_dir, notes = _post_training(ctx, stage, cfg, base, data_default, eval_data)
    frozen = 0
    if cfg.uses_reference:
        ref_dir = starting_weights(ctx.workspace, ref)[1] if ref else step_dir
        if cfg.precompute_ref:
            notes.append(f"reference           {ref_dir}: log-probs computed in one pass "
                         "before training, not held while training")
        else:
            frozen = trunk_parameters(ref_dir)
    shape, _ = model_shape(step_dir)
    n, world = parameters(shape), world_size()
    pairs = cfg.micro_batch_size * cfg.grad_accum * world
    trainable, base = lora_split(shape, n, cfg)
    if base and not ref:
        frozen = 0  # LoRA: the reference is the frozen base itself, adapters disabled
    show(ctx, plan(stage, shape, trainable=trainable, total=trainable + base + frozen,
              unit="pairs" if stage == "dpo" else "completions (+ their mismatched pairs)",
              per_step=pairs, tokens_per_step=2 * pairs * cfg.seq_len, sequences=2 * cfg.micro_batch_size,
              seq_len=cfg.seq_len, cfg=cfg, world_size=world, frozen=base + frozen,
              saved=trainable if base else n,
              dense_mask=dense_attention_mask(), notes=notes))


def plan_kto(ctx, cfg, base: str, ref: str | None, eval_data: str | None) -> None:
    plan_dpo(ctx, cfg, base, ref, eval_data, stage="kto")


def plan_ppo(ctx, cfg, policy: str, reward_model: str | None, eval_data: str | None) -> None:
    from llmkit.dryrun import BYTES, human_bytes, parameters, plan
    from llmkit.rewards import reward_mode
    from llmkit.train.loading import starting_weights

    step_dir, notes = _post_training(ctx, "ppo", cfg, policy, "prompts_train", eval_data)
    rm_dir = starting_weights(ctx.workspace, reward_model)[1] if reward_model else None
    mode = reward_mode(cfg.reward, rm_dir is not None)
    shape, _ = model_shape(step_dir)
    n, world = parameters(shape), world_size()
    rm_params = trunk_parameters(rm_dir) if rm_dir is not None and (
        mode != "verify" or cfg.value_model == "separate") else 0
    trainable, base = lora_split(shape, n, cfg)
    saved = trainable
    if cfg.algo == "ppo":
        trainable += (rm_params or n) if cfg.value_model == "separate" else 0
        trainable += shape.hidden_size + 1  # the value head
    # the reference policy (under LoRA the frozen base itself, adapters disabled) + the reward model
    frozen = (base or n) + (rm_params if mode != "verify" else 0)
    responses = cfg.micro_batch_size * cfg.grad_accum * world
    kv_cache = 2 * shape.n_layers * shape.kv_width * cfg.rollout_size * cfg.seq_len * BYTES[cfg.precision]
    notes.append(f"rollouts            {cfg.rollout_size} responses of up to {cfg.max_new_tokens} "
                 f"tokens each ({cfg.algo}, reward {mode}); their KV cache {human_bytes(kv_cache)}")
    show(ctx, plan("ppo", shape, trainable=trainable, total=trainable + frozen, unit="responses",
              per_step=responses, tokens_per_step=responses * cfg.seq_len,
              sequences=cfg.micro_batch_size * (2 if cfg.value_model == "separate" and cfg.algo == "ppo" else 1),
              seq_len=cfg.seq_len, cfg=cfg, world_size=world, frozen=frozen, saved=saved,
              loss_positions=cfg.micro_batch_size * cfg.max_new_tokens,
              dense_mask=dense_attention_mask(), notes=notes))


def lora_split(shape, n: int, cfg) -> tuple[int, int]:
    """(trained parameters, frozen base parameters) of a model of `n` parameters: all trained and
    no frozen base, or under LoRA (`lora.r` > 0) the adapters trained and the `n` weights frozen."""
    from llmkit.dryrun import lora_parameters

    if not cfg.lora.enabled:
        return n, 0
    return lora_parameters(shape, cfg.lora.r, cfg.lora.target), n
