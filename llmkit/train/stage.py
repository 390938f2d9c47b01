"""The skeleton of every training stage (pretrain, sft, rm, dpo, ppo): one function, `fit_stage`.

A trainer names its inputs and hands over a `prepare` function; `fit_stage` opens the
checkpoint run (and stops there when it is up to date), calls `prepare` on every process to
load the start and the data into a `Fit`, and inside the run builds the trainer's Task, scores
the model before and after the engine trains it, records the stats (main process) and prints
the summary. With `lora.r > 0` it freezes the model and adds LoRA adapters first (`checkpoints.lora`):
the Task, the scores and the engine see the model with its adapters.

    def run_sft(ctx, cfg, base, eval_data=None):
        base_art, base_step, data_art, eval_art = post_training_inputs(...)

        def prepare() -> Fit:
            model, tokenizer = load_start(base_step, cfg)
            ...
            return Fit(lambda dist: SftTask(model, ...), tokenizer.path, sft_summary, model=model, ...)

        return fit_stage(ctx, "sft", cfg, [base_art, data_art, eval_art], prepare)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmkit.errors import ConfigError
from llmkit.checkpoints.loading import starting_weights
from llmkit.core.progress import print_summary
from llmkit.train.checkpoint import open_run, training_run
from llmkit.train.engine import Engine
from llmkit.checkpoints.lora import PINNED_BASE, adapters_of, add_adapters, pin_base, pinned_start, trainable_share
from llmkit.model.quant import unpool_large_allocations
from llmkit.train.gate import (GATE, check_gate, gate_finished_run, gate_inputs, gate_lines, gate_record,
                               gate_scores, start_of)
from llmkit.train.replay import replay_input, replay_source
from llmkit.train.threads import threads_label
from llmkit.tokenizers.sentencepiece import open_tokenizer

# the stats most stages take from the engine's last logged record: stat name -> record key
LOSSES = {"final_loss": "loss", "val_loss": "val_loss"}


@dataclass
class Fit:
    """What a trainer hands `fit_stage` once its start and data are loaded (on every process)."""

    task: Callable  # (DistEnv) -> Task, built inside the run: batches are sharded by rank
    tokenizer_dir: Path  # copied into every checkpoint
    summary: Callable[[dict], list]  # the stats -> the summary lines between "steps" and "seconds"
    model: Any = None  # the start: moved to the device before `score` and the Task see it
    start: Path | None = None  # the step folder `model` was loaded from: the base of LoRA adapters
    model_config: Any = None  # each checkpoint's config.json; None = the Task model's `config`
    score: Callable | None = None  # (model, DistEnv) -> {name: value}: recorded as base_<name>
    #                                 (before training) and <name> (after)
    stats: dict = field(default_factory=dict)  # what is known before training (data counts)
    metrics: dict = field(default_factory=dict)  # stat name -> key of the engine's last record
    after: Callable | None = None  # (FitResult, Task) -> the stats only the finished run knows
    extra: dict = field(default_factory=dict)  # manifest entries beside the stats


def fit_stage(ctx, stage: str, cfg, inputs: list, prepare: Callable[[], Fit]):
    """Train the checkpoint run `stage` (or ctx's --out) from `inputs` (None entries dropped, the
    rest in the order the run records them); returns its builder."""
    # replay and gate inputs are checked before anything is written (bad input: exit 2)
    replay_art, gate_arts = replay_input(ctx, stage, cfg), gate_inputs(ctx, stage, cfg)
    b, plan = open_run(ctx, stage, cfg, [a for a in [*inputs, replay_art] if a is not None])
    if b.up_to_date:
        check_gate(b.name, gate_finished_run(ctx, b, cfg, gate_arts, start_of(ctx, b, inputs)))
        return b
    fit = prepare()
    b.extra.update(fit.extra)
    with_replay = replay_source(ctx, stage, cfg, fit, replay_art) if replay_art is not None else None
    if cfg.lora.enabled:
        add_lora(fit, cfg)
    with training_run(b, plan) as dist:
        if cfg.lora.enabled:
            pin_lora_base(fit, b.final, dist.is_main)
        if fit.model is not None:
            fit.model.to(dist.device)
        before = fit.score(fit.model, dist) if fit.score else {}
        task = fit.task(dist)
        # the gate scores the start and the trained model in the process that holds it whole
        gated = gate_arts and dist.is_main and not (cfg.zero_stage == 3 and dist.world_size > 1)
        tokenizer = open_tokenizer(fit.tokenizer_dir) if gated else None
        gate_before = gate_scores(task.model, tokenizer, gate_arts, cfg, dist.device) if gated else None
        if with_replay is not None:
            task = with_replay(task, dist)
        result = Engine(b.final, cfg.train_config(), task, tokenizer_dir=fit.tokenizer_dir,
                        model_config=fit.model_config).fit()
        after = fit.score(fit.model, dist) if fit.score else {}
        if gated:
            b.extra[GATE] = {**gate_record(gate_before, gate_scores(task.model, tokenizer, gate_arts,
                                                                    cfg, dist.device), cfg),
                             "start": str(fit.start), "fingerprints": [a.fingerprint for a in gate_arts]}
        if dist.is_main:
            b.stats.update(fit.stats, steps=result.step, tokens_seen=result.tokens_seen,
                           threads=result.threads, cpu_kernels=result.cpu_kernels, precision=result.precision,
                           **({"base_products": result.base_products} if cfg.lora.enabled else {}))
            b.stats.update({name: result.metrics.get(key) for name, key in fit.metrics.items()})
            b.stats.update(fit.after(result, task) if fit.after else {})
            for name, value in after.items():
                b.stats.update({f"base_{name}": before[name], name: value})
    if dist.is_main:
        print_summary(f"{b.name} done", [("steps", result.step), *fit.summary(b.stats),
                                         *gate_lines(b.extra.get(GATE)),
                                         ("CPU threads", threads_label(result.threads)),
                                         ("CPU kernels", result.cpu_kernels), ("precision", result.precision),
                                         *([("LoRA base products", result.base_products)] if cfg.lora.enabled else []),
                                         ("seconds", round(time.time() - b.started, 1))])
    check_gate(b.name, b.extra.get(GATE))
    return b


def add_lora(fit: Fit, cfg) -> None:
    """Adapters on the start of the run (`lora.add_adapters`), their size in the stats."""
    if fit.model is None or fit.start is None:
        raise ConfigError("lora.r > 0 trains adapters on existing weights: start from a checkpoint "
                          "(--from), or set lora.r=0")
    add_adapters(fit.model, cfg.lora, fit.start, seed=cfg.seed, compute_dtype=cfg.torch_dtype)
    unpool_large_allocations(fit.model)  # a quantised base's per-step buffers: see there
    fit.stats.update(trainable_share(fit.model))


def pin_lora_base(fit: Fit, run_dir: Path, is_main: bool) -> None:
    """The adapters name the run's pin of their base (`lora.pin_base`), made by the main process
    once the run folder is started."""
    if is_main:
        pin_base(fit.start, run_dir)
    adapters_of(fit.model).base = (Path(run_dir) / PINNED_BASE).resolve()


def run_start(ctx, stage: str, cfg, from_: str):
    """`starting_weights` of run `stage` (or --out); a LoRA run that continues (not started over
    by --force) starts from the base it pinned (`lora.pinned_start`)."""
    art, step_dir = starting_weights(ctx.workspace, from_)
    if cfg.lora.enabled and not (ctx.force and cfg.resume_from is None):
        return pinned_start(ctx.workspace.path(ctx.out_name(stage)), art, step_dir)
    return art, step_dir
