"""The one training loop every trainer shares (pretrain, sft, rm, dpo, ppo), on DeepSpeed.

A trainer supplies a `Task` — its model, its batches and its loss — and the `Engine` does the
rest: ZeRO 0-3 (+ CPU offload), fp32 / bf16 / fp16 with dynamic loss scaling, gradient
accumulation and clipping, AdamW with warmup + cosine decay, activation checkpointing, NaN/Inf
steps skipped and counted, metrics (metrics.jsonl, TensorBoard, console, tokens/s, MFU),
periodic validation, and checkpoints that resume exactly (the same per-step losses as a run
that was never stopped).

    class MyTask(Task):
        def loss(self, model, batch):
            logits = model(batch["input_ids"])
            loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
            return loss, {}

    Engine(run_dir, TrainConfig(max_steps=100), MyTask(model, train_data=loader)).fit()

It runs as one process with no launcher (CPU or one GPU) and under `torchrun` / `deepspeed`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from llmkit.checkpoints import step_folders as ckpt
from llmkit.errors import ConfigError, UserError
from llmkit.checkpoints import lora
from llmkit.train.config import TrainConfig, lr_at
from llmkit.train.checkpointer import Checkpointer
from llmkit.train.cpu_precision import base_products, trained_precision
from llmkit.train.distributed import seed_everything, setup_distributed
from llmkit.train.metrics import ConsoleLine, MetricsLog, device_peak_flops, mfu, training_flops_per_token
from llmkit.train.optim import deepspeed_config, make_optimizer
from llmkit.train.task import ITEMS_PER_MICRO_BATCH, Task, to_device
from llmkit.train.threads import CpuThreads, cpu_kernel_path

log = logging.getLogger("llmkit.train")


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM arrived; a checkpoint of the last finished step was saved first."""


class TrainingDiverged(UserError):
    """Too many consecutive steps had NaN/Inf loss or gradients."""


@dataclass
class FitResult:
    step: int  # optimizer steps done
    tokens_seen: int  # training tokens over all processes
    skipped_steps: int  # steps skipped for NaN/Inf
    metrics: dict  # the last logged record
    checkpoint: Path | None  # the newest complete step folder
    threads: dict  # the CPU threads it computed on (`CpuThreads.record`)
    cpu_kernels: str  # `cpu_kernel_path`: llmkit-avx512, torch or cuda
    precision: str  # the precision it trained in: the config's, or fp32 for bf16 on a CPU without the instructions
    base_products: str  # a LoRA base's products: lora.base_products, or fp32 where bf16 cannot run


class Engine:
    """Trains `task.model` into `run_dir` (a checkpoint run) and resumes whatever is there.

    `tokenizer_dir` is copied into every checkpoint; `init_state_dict` (e.g. from
    `checkpoint.load_weights`) starts a new run from existing weights with a fresh optimizer and
    schedule — it is ignored when run_dir already holds a checkpoint to resume. `model_config` is
    written as each checkpoint's config.json (default: `task.model.config`). A model with LoRA
    adapters (`lora.add_adapters`) is checkpointed as its adapters and the base they adapt.
    """

    def __init__(self, run_dir, train_cfg: TrainConfig, task: Task, tokenizer_dir=None,
                 init_state_dict: dict | None = None, model_config=None):
        self.run_dir = Path(run_dir)
        self.cfg = train_cfg
        self.task = task
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else None
        self.init_state_dict = init_state_dict
        self.model_config = _as_dict(model_config if model_config is not None
                                     else getattr(task.model, "config", None))
        self.adapters = lora.adapters_of(task.checkpoint_module(task.model))
        self.step = 0
        self.tokens_seen = 0
        self.skipped_steps = 0
        self.bad_streak = 0
        self.last_record: dict = {}
        self._stop_signal: int | None = None

    # -- setup ------------------------------------------------------------------------------

    def fit(self) -> FitResult:
        """Train to max_steps (resuming if run_dir holds a checkpoint); checkpoint at the end."""
        from llmkit.model.packed_linear import packed_linears

        self.dist = setup_distributed()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = MetricsLog(self.run_dir, enabled=self.dist.is_main)
        self.console = ConsoleLine(enabled=self.dist.is_main, max_steps=self.cfg.max_steps)
        with CpuThreads.start(self.cfg.threads, self.dist, self.console.note) as self.threads:
            self._build()
            if not self._resume():
                seed_everything(self.cfg.seed + self.dist.rank)
            self.metrics.resume_at(self.step)
            handlers = self._catch_signals()
            try:
                # frozen layers (a LoRA base) multiply through packed weights for the whole run
                with packed_linears(self.task.model, frozen_only=True, frozen_dtype=self.base_dtype):
                    self._train_loop()
            finally:
                self._restore_signals(handlers)
                self.metrics.close()
                self.console.close()
        return FitResult(self.step, self.tokens_seen, self.skipped_steps, self.last_record,
                         ckpt.resolve_step_dir(self.run_dir) if ckpt.read_latest(self.run_dir) else None,
                         self.threads.record(self.step), cpu_kernel_path(self.dist.device), self.cfg.precision,
                         self.base_products)

    def _build(self) -> None:
        import deepspeed
        import torch

        cfg, model = self.cfg, self.task.model
        if cfg.precision == "fp16" and not self.dist.device.startswith("cuda"):
            raise ConfigError("precision fp16 needs a GPU (DeepSpeed has no fp16 on CPU); use bf16 or fp32")
        # bf16 on a CPU without the bf16 instructions would be several times slower: fp32 instead
        precision = trained_precision(cfg.precision, on_gpu=self.dist.device.startswith("cuda"))
        if precision != cfg.precision:
            self.cfg = cfg = dataclasses.replace(cfg, precision=precision)
        self.base_products = base_products(cfg.lora.base_products if cfg.lora.enabled else "fp32",
                                           on_gpu=self.dist.device.startswith("cuda"))
        self.base_dtype = torch.bfloat16 if self.base_products == "bf16" else torch.float32
        if self.init_state_dict is not None and not any(map(ckpt.is_complete, ckpt.step_dirs(self.run_dir))):
            model.load_state_dict(self.init_state_dict, strict=True)
        if cfg.activation_checkpointing:
            if not hasattr(model, "gradient_checkpointing"):
                raise ConfigError(f"activation_checkpointing: {type(model).__name__} has no "
                                  "gradient_checkpointing switch")
            model.gradient_checkpointing = True
        self.n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.flops_per_token = training_flops_per_token(model, self.task.flops_per_token())
        self.peak_flops = cfg.peak_flops or device_peak_flops(self.dist.device)
        # a measured CPU peak is per thread in use (metrics.measured_cpu_peak_flops)
        self.peak_threads = None if cfg.peak_flops or self.dist.device.startswith("cuda") else \
            torch.get_num_threads()
        if self.dist.device.startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = True  # fp32 runs use tensor cores (TF32)
            torch.backends.cudnn.allow_tf32 = True
        if cfg.compile:
            model.compile()  # in place: state_dict names stay those of the module
        if cfg.zero_stage and self.dist.world_size == 1 and not cfg.offload_optimizer:
            log.warning("zero_stage=%d on one process partitions nothing and only adds work: use "
                        "zero_stage=0 on a single device (or offload_optimizer)", cfg.zero_stage)
        guarded = cfg.zero_stage == 0 and cfg.precision == "fp32"
        on_gpu = self.dist.device.startswith("cuda")
        self.optimizer = make_optimizer(model, cfg, on_gpu, guarded)
        self.model, *_ = deepspeed.initialize(model=model, optimizer=self.optimizer,
                                              config=deepspeed_config(cfg, on_gpu, guarded))
        if cfg.zero_stage == 0 and self.dist.world_size == 1:
            # alone, DeepSpeed would still flatten, scale and copy back every gradient
            self.model.enable_backward_allreduce = False
        self.checkpointer = Checkpointer(self.run_dir, cfg, self.dist, self.model, self.task, self.adapters,
                                         self.tokenizer_dir, self.model_config)
        self.device = self.task.device = torch.device(self.dist.device)

    # -- checkpoints (llmkit.train.checkpointer) -------------------------------------------------

    def _resume(self) -> bool:
        resumed = self.checkpointer.resume()
        if resumed is None:
            return False
        step_dir, counters = resumed
        self.step, self.tokens_seen = counters["step"], counters["tokens_seen"]
        self.skipped_steps, self.bad_streak = counters["skipped_steps"], counters["bad_streak"]
        self.last_record = counters["metrics"]
        self.threads.resume(counters["threads"], self.step)
        self.console.note(f"resumed from {step_dir} (step {self.step})")
        return True

    def save_checkpoint(self) -> Path:
        """Write (or find, if this step is saved already) the current step's checkpoint."""
        return self.checkpointer.save({"step": self.step, "tokens_seen": self.tokens_seen,
                                       "skipped_steps": self.skipped_steps, "bad_streak": self.bad_streak,
                                       "metrics": self.last_record, "threads": self.threads.history})

    # -- the loop ------------------------------------------------------------------------------

    def _train_loop(self) -> None:
        cfg = self.cfg
        while self.step < cfg.max_steps:
            record = self._train_step(self.step + 1)
            self.step += 1
            last = self.step == cfg.max_steps
            tokens, stopping = record.pop("tokens"), record.pop("_stop")
            record["threads"] = self.threads.count  # those this step computed on
            self.threads.watch(self.step, record["step_s"], tokens)
            if self.step == 1:
                self._warn_if_undertrained(tokens)
            if cfg.eval_every and (self.step % cfg.eval_every == 0 or last):
                record.update(self.evaluate())
            if self.step % cfg.log_every == 0 or last or any(k.startswith("val_") for k in record):
                self.metrics.write(record)
                self.console.show(record)
            self.last_record = record
            if self.bad_streak >= cfg.max_bad_steps:
                raise TrainingDiverged(
                    f"training stopped at step {self.step}: {self.bad_streak} consecutive steps had "
                    f"NaN/Inf loss or gradients ({self.skipped_steps} skipped in all). The last good "
                    f"checkpoint is {ckpt.read_latest(self.run_dir) or 'none'} in {self.run_dir}; "
                    "lower lr, raise warmup_steps, use bf16 instead of fp16, or check the data")
            if last or stopping or (cfg.save_every and self.step % cfg.save_every == 0):
                self.save_checkpoint()
            if stopping:
                raise TrainingInterrupted(f"stopped by signal {stopping} after step {self.step}; "
                                          f"checkpoint saved in {self.run_dir}")

    def _train_step(self, step: int) -> dict:
        import torch

        cfg, model = self.cfg, self.model
        lr = lr_at(step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        model.train()
        start = time.perf_counter()
        losses, sums = [], {}
        skipped_before = model.skipped_steps
        # the whole step's micro-batches first: a loss that is a mean over the step's items
        # (tokens) needs their count before the first backward
        batches = [self.task.next_batch(model) for _ in range(cfg.grad_accum)]
        tokens = sum(map(self.task.batch_tokens, batches))  # on the host batches: no device sync
        per_micro_batch = items_per_micro_batch(self.task, batches, self.device, self.dist.world_size)
        batches = [to_device(b, self.device) for b in batches]
        data_s = time.perf_counter() - start
        for batch in batches:
            if per_micro_batch is not None:
                batch[ITEMS_PER_MICRO_BATCH] = per_micro_batch
            loss, task_metrics = self.task.loss(model, batch)
            model.backward(loss)
            model.step()
            losses.append(loss.detach().float())
            _add_metrics(sums, task_metrics)
        skipped = model.skipped_steps != skipped_before
        keys = sorted(sums)
        stats = _stacked([torch.stack(losses).sum(), len(losses), tokens,
                          float(self._stop_signal or 0), *(sums[k] for k in keys)], self.device)
        if self.dist.world_size > 1:
            torch.distributed.all_reduce(stats)
        stats = stats.tolist()
        step_s = time.perf_counter() - start
        loss_sum, n_micro, global_tokens, stop = stats[:4]
        self.tokens_seen += int(global_tokens)
        if skipped:
            self.skipped_steps += 1
            self.bad_streak += 1
        else:
            self.bad_streak = 0
        tokens_per_s = global_tokens / step_s
        grad_norm = model.get_global_grad_norm()
        record = {
            "step": step,
            "loss": loss_sum / n_micro,
            "lr": lr,
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            "tokens_per_s": tokens_per_s,
            "mfu": mfu(self.flops_per_token, tokens_per_s, self._peak_flops() * self.dist.world_size),
            "data_s": data_s,
            "step_s": step_s,
            "tokens_seen": self.tokens_seen,
            "skipped_steps": self.skipped_steps,
            **{k: v / n_micro for k, v in zip(keys, stats[4:])},
        }
        if cfg.precision == "fp16":
            record["loss_scale"] = float(getattr(model.optimizer, "loss_scale", math.nan))
        record["tokens"] = int(global_tokens)
        record["_stop"] = int(self._stop_signal or signal.SIGTERM) if stop else 0
        return record

    def _peak_flops(self) -> float:
        """The devices' peak FLOP/s at the threads computing now (see `_build`)."""
        return self.peak_flops * (self.threads.count / self.peak_threads if self.peak_threads else 1)

    def evaluate(self) -> dict:
        """Mean loss (and task metrics) over up to eval_batches batches per process, with
        val_ppl = exp(val_loss) when the task's loss is a token NLL (`Task.perplexity`). Leaves
        the training RNG streams untouched."""
        import torch

        batches = self.task.eval_batches()
        if batches is None:
            return {}
        taken = list(itertools.islice(batches, self.cfg.eval_batches))
        count = torch.tensor([len(taken)], dtype=torch.float64, device=self.device)
        if self.dist.world_size > 1:  # ZeRO-3 gathers weights in forward: all ranks run as many
            torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MIN)
        n = int(count.item())
        if n == 0:
            return {}
        sums: dict[str, float] = {}
        self.model.eval()
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            for batch in taken[:n]:
                loss, task_metrics = self.task.eval_loss(self.model, to_device(batch, self.device))
                _add_metrics(sums, {"loss": loss, **task_metrics})
        self.model.train()
        keys = sorted(sums)
        stats = _stacked([sums[k] for k in keys], self.device)
        if self.dist.world_size > 1:
            torch.distributed.all_reduce(stats)
        means = {f"val_{k}": v / (n * self.dist.world_size) for k, v in zip(keys, stats.tolist())}
        if self.task.perplexity:
            means["val_ppl"] = math.exp(min(means["val_loss"], 700.0))
        return means

    def _warn_if_undertrained(self, tokens_per_step: int) -> None:
        planned = tokens_per_step * self.cfg.max_steps
        if self.task.warn_undertrained and self.dist.is_main and planned < 20 * self.n_params:
            log.warning("planned %s training tokens for %s parameters: compute-optimal training "
                        "(Chinchilla) wants ~20 tokens per parameter (%s)", f"{planned:,}",
                        f"{self.n_params:,}", f"{20 * self.n_params:,}")

    # -- signals ---------------------------------------------------------------------------------

    def _catch_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return {}

        def request_stop(signum, frame):
            if self._stop_signal is not None:  # a second Ctrl-C: stop now
                raise KeyboardInterrupt
            self._stop_signal = signum
            self.console.note(f"signal {signum}: saving a checkpoint after this step, then stopping")

        return {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def _restore_signals(handlers) -> None:
        for s, h in handlers.items():
            signal.signal(s, h)


def items_per_micro_batch(task: Task, batches: list, device, world_size: int) -> float | None:
    """The items (`Task.items_in_batch`) of one optimizer step's `batches` on every process,
    over the step's number of micro-batches; None when the task's loss is a plain mean per
    micro-batch. DeepSpeed divides each micro-batch's loss by grad_accum and averages gradients
    over processes, so a loss that is its item sum over this makes the step's gradient the mean
    over every item of the step, however the items fall into micro-batches (TRL's
    num_items_in_batch). All processes must call it (one all-reduce)."""
    import torch

    counts = [task.items_in_batch(b) for b in batches]
    if counts[0] is None:
        return None
    total = torch.tensor([float(sum(counts))], dtype=torch.float64, device=device)
    if world_size > 1:
        torch.distributed.all_reduce(total)
    return max(total.item(), 1.0) / (len(batches) * world_size)


def _add_metrics(sums: dict, metrics: dict) -> None:
    """Running sums of a task's metrics; device tensors stay on the device, so a step costs one
    host sync (`_stacked(...).tolist()`) instead of one per metric and micro-batch."""
    import torch

    for k, v in metrics.items():
        sums[k] = sums.get(k, 0.0) + (v.detach().double() if torch.is_tensor(v) else v)


def _stacked(values: list, device):
    """Python numbers and 0-dim tensors as one float64 vector on `device` (for one all-reduce)."""
    import torch

    return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device).reshape(())
                        for v in values])


def _as_dict(config) -> dict:
    return {} if config is None else dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
