"""Knowledge distillation (`llmkit distill`): a student learns a teacher's next-token
distribution on the replies of chat data (Hinton et al. 2015; GKD, Agarwal et al. 2024).

At every labelled position (the replies and their end of turn, what SFT learns) the loss is a
divergence between the student's and the teacher's distributions — forward KL, reverse KL or GKD's
generalised JSD at β, softened by a temperature (`distill_losses`, equal to TRL's
`generalized_jsd_loss`) —, a mean over the labelled tokens of the optimizer step like sft's, mixed
with the cross-entropy of the data's replies by `hard_label_weight`. The teacher is any llmkit
checkpoint with the student's tokenizer (a LoRA student trains adapters as in every stage); it is
held frozen beside the student and run on each batch, or, with `teacher_top_k` and
`precompute_teacher`, read once into its top-k logits (`distill_data`) and freed.
With `on_policy` = λ > 0, that share of batches (drawn from (seed, batch)) replace each row's reply
with one the student samples (GKD's λ); a dataset of prompts alone trains on those only (λ = 1).
Before and after training the student is scored by greedy exact match on held-out rows, as sft,
and the teacher once on the same rows (`stats.teacher_accuracy`).
"""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from llmkit.data.chat import IGNORE_INDEX, fixed_batches
from llmkit.errors import ConfigError, UserError
from llmkit.checkpoints.loading import load_model, starting_weights
from llmkit.tokenizers.sentencepiece import same_tokenizer
from llmkit.train.distill_data import (DistillData, TOP_K_DIR, collate_distill, distill_data, load_top_k,
                                       precompute_top_k, store_top_k, student_replies)
from llmkit.train.distill_losses import DISTILL_LOSSES, distill_divergence, restricted_to_top_k, teacher_top_k
from llmkit.train.distributed import barrier
from llmkit.train.posttrain import (GenerativeConfig, batch_stream, check_seq_len, evaluate_exact_match,
                                    exact_match_scorer, exact_match_summary, load_start)
from llmkit.train.stage import Fit, fit_stage, run_start
from llmkit.train.task import ITEMS_PER_MICRO_BATCH, Task


@dataclass
class DistillConfig(GenerativeConfig):
    max_steps: int = 300  # optimizer steps
    packing: bool = True  # several conversations per sequence (off when on_policy > 0)
    loss_type: str = "forward_kl"  # forward_kl | reverse_kl | jsd (GKD's generalised JSD at beta)
    beta: float = 0.5  # jsd: the teacher's weight in the mixture (TRL's GKDConfig.beta); 0 and 1 are
    #                    forward and reverse KL
    temperature: float = 1.0  # softmax temperature of both distributions in the loss (no T² factor, as TRL)
    hard_label_weight: float = 0.0  # α: loss = (1 − α)·divergence + α·cross-entropy of the data's replies
    on_policy: float = 0.0  # λ: share of batches whose replies the student samples (GKD's lmbda)
    sample_temperature: float = 1.0  # sampling temperature of those replies (max_new_tokens long at most)
    teacher_top_k: int = 0  # k > 0: both distributions on the teacher's k likeliest tokens + one bucket for the rest
    precompute_teacher: bool = False  # the teacher's top-k logits computed once (stored in the run folder), the
    #                                   teacher then freed; needs teacher_top_k > 0 and on_policy = 0

    def __post_init__(self):
        super().__post_init__()
        if self.loss_type not in DISTILL_LOSSES:
            close = difflib.get_close_matches(self.loss_type, DISTILL_LOSSES, n=1, cutoff=0.4)
            raise ConfigError(f"loss_type must be one of {', '.join(DISTILL_LOSSES)}, got "
                              f"{self.loss_type!r}" + (f"; did you mean {close[0]!r}?" if close else ""))
        if self.loss_type != "jsd" and self.beta != 0.5:
            raise ConfigError(f"beta applies to loss_type=jsd, not {self.loss_type}; drop it (jsd with "
                              "beta=0 is forward_kl, beta=1 reverse_kl)")
        for key in ("beta", "hard_label_weight", "on_policy"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"{key} must be in [0, 1], got {getattr(self, key)}")
        if not (self.temperature > 0 and self.sample_temperature > 0) or self.teacher_top_k < 0:
            raise ConfigError("temperature and sample_temperature must be > 0, teacher_top_k >= 0")
        if self.precompute_teacher and (self.teacher_top_k == 0 or self.on_policy > 0):
            raise ConfigError("precompute_teacher stores the teacher's top-k logits of the data's "
                              "replies: set teacher_top_k (e.g. 64) and on_policy=0, or drop it")
        if self.model.rope_scaling is not None or self.model.max_seq_len or self.model.rope_theta:
            raise ConfigError("distill does not change the student's RoPE (model.*): extend its context with "
                              "sft or pretrain --from and --set model.rope_scaling=…, then distill into that run")
        if self.on_policy and self.zero_stage == 3:
            raise ConfigError("on_policy > 0 samples replies with the whole student, which ZeRO-3 "
                              "shards: use zero_stage <= 2")


class DistillTask(Task):
    """The divergence from the teacher at the labelled positions (+ α · the replies' cross-
    entropy): a mean over the labelled tokens of the whole optimizer step, as sft's loss."""

    def __init__(self, model, train_data, eval_data, cfg: DistillConfig, teacher, *, stop_ids,
                 pad_id: int, rank: int = 0):
        super().__init__(model, train_data, eval_data)
        self.cfg, self.teacher = cfg, teacher  # teacher None: its top-k logits are in the batches
        self.stop_ids, self.pad_id, self.rank = list(stop_ids), pad_id, rank
        self.batches_drawn = 0
        self.teacher_accuracy, self.teacher_seconds = None, 0.0

    def items_in_batch(self, batch) -> int:
        return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())

    def next_batch(self, model):
        batch = super().next_batch(model)
        self.batches_drawn += 1
        draw = np.random.default_rng([self.cfg.seed, self.batches_drawn]).random()
        if draw >= self.cfg.on_policy:
            return batch
        cfg = self.cfg
        seed = int(np.random.default_rng([cfg.seed, self.rank, self.batches_drawn]).integers(2 ** 62))
        return student_replies(getattr(model, "module", model), batch, max_new_tokens=cfg.max_new_tokens,
                               seq_len=cfg.seq_len, temperature=cfg.sample_temperature,
                               stop_ids=self.stop_ids, pad_id=self.pad_id, seed=seed,
                               device=self.device or "cpu")

    def teacher_logits(self, model, args, at):
        import torch

        with torch.no_grad():
            self.teacher.to(self.device, next(model.parameters()).dtype)
            return self.teacher(*args, logits_at=at)

    def compared(self, model, student, batch, args, at):
        """(student, teacher) logits of the distributions the divergence compares."""

        temperature = self.cfg.temperature
        if "top_logits" in batch:
            return restricted_to_top_k(student, batch["top_logits"], batch["top_ids"].long(), temperature)
        teacher = self.teacher_logits(model, args, at)
        vocab = min(student.shape[-1], teacher.shape[-1])  # an embedding padded past the tokenizer's
        student, teacher = student[:, :vocab], teacher[:, :vocab]
        if self.cfg.teacher_top_k:
            top = teacher_top_k(teacher, self.cfg.teacher_top_k, temperature)
            return restricted_to_top_k(student, *top, temperature)
        return student, teacher

    def loss(self, model, batch):
        import torch.nn.functional as F

        cfg = self.cfg
        targets = batch["labels"][:, 1:]
        mask = targets != IGNORE_INDEX
        at = F.pad(mask, (0, 1), value=False)  # position t predicts token t + 1
        args = (batch["input_ids"], batch.get("position_ids"), batch.get("doc_ids"))
        student = model(*args, logits_at=at)
        labels = targets[mask]
        items = batch.get(ITEMS_PER_MICRO_BATCH, len(labels))
        divergence = distill_divergence(*self.compared(model, student, batch, args, at),
                                        cfg.loss_type, cfg.beta, cfg.temperature).sum() / items
        nll = F.cross_entropy(student, labels, reduction="sum") / items
        sampled = "student_replies" in batch  # no data reply to take a cross-entropy from
        alpha = 0.0 if sampled else cfg.hard_label_weight
        loss = (1 - cfg.hard_label_weight) * divergence + alpha * nll + model.aux_loss
        return loss, {"divergence": divergence.detach(), "nll": nll.detach(),
                      "accuracy": (student.argmax(-1) == labels).float().mean(),
                      "on_policy": float(sampled)}

    def flops_per_token(self) -> float:
        return self.model.flops_per_token(self.cfg.seq_len)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "batches_drawn": self.batches_drawn}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.batches_drawn = state.get("batches_drawn", 0)


# -- the teacher ----------------------------------------------------------------------------

@dataclass
class DistillInputs:
    student_art: object
    student_step: Path
    teacher_art: object
    teacher_step: Path
    data_art: object
    eval_art: object


def distill_inputs(ctx, cfg: DistillConfig, teacher: str, base: str, eval_data: str | None):
    """The artifacts of a run; the teacher must read the student's token ids."""

    student_art, student_step = run_start(ctx, "distill", cfg, base)
    teacher_art, teacher_step = starting_weights(ctx.workspace, teacher)
    if not same_tokenizer(teacher_step / "tokenizer", student_step / "tokenizer"):
        raise UserError(
            f"the teacher {teacher_step} and the student {student_step} use different tokenizers; "
            "distillation compares their next-token distributions id by id, so both must read the "
            f"same ids: start the student (--from) from a run trained with the teacher's tokenizer "
            f"({teacher_step / 'tokenizer'}, e.g. `llmkit pretrain` on tokens made with it), or "
            "pick a teacher of the student's family")
    return DistillInputs(student_art, student_step, teacher_art, teacher_step,
                         ctx.input(default="sft_train"),
                         ctx.workspace.artifact(eval_data) if eval_data else None)


def ready_teacher(task: DistillTask, teacher_step: Path, data: DistillData, tokenizer, run_dir: Path,
                  dist) -> None:
    """Load the teacher, score it on the held-out rows (main process), and either keep it on the
    task or give the data its top-k logits (computed once, or read back) and let it go;
    `task.teacher_seconds` is what that cost."""
    cfg = task.cfg
    started = time.time()
    teacher, _ = load_model(teacher_step, dist.device)
    check_seq_len(cfg, teacher)
    teacher.requires_grad_(False).to(cfg.torch_dtype)
    if dist.is_main and data.scored:
        task.teacher_accuracy = round(evaluate_exact_match(teacher, tokenizer, data.scored,
                                                           cfg.max_new_tokens), 4)
    if cfg.precompute_teacher:
        give_top_k(task, teacher, data, tokenizer, Path(run_dir) / TOP_K_DIR, dist)
    else:
        task.teacher = teacher
    task.teacher_seconds = time.time() - started


def give_top_k(task: DistillTask, teacher, data: DistillData, tokenizer, folder: Path, dist) -> None:
    """The teacher's top-k logits on every item, computed by the main process (or read back from
    `folder`, where a resumed run finds them) and read by the others."""

    cfg, items = task.cfg, data.train + data.heldout
    if dist.is_main and not load_top_k(folder, items):
        precompute_top_k(teacher, items, k=cfg.teacher_top_k, vocab=task.model.config.vocab_size,
                         pad_id=tokenizer.pad_id, batch_size=2 * cfg.micro_batch_size, device=dist.device,
                         temperature=cfg.temperature)
        store_top_k(folder, items)
    barrier()
    if not dist.is_main:
        load_top_k(folder, items)


def distill_task(student, teacher_step, data: DistillData, cfg: DistillConfig, tokenizer, run_dir,
                 dist) -> DistillTask:
    collate = partial(collate_distill, pad_id=tokenizer.pad_id)
    task = DistillTask(student, None, None, cfg, None, stop_ids=tokenizer.stop_ids,
                       pad_id=tokenizer.pad_id, rank=dist.rank)
    ready_teacher(task, teacher_step, data, tokenizer, run_dir, dist)
    task.train_data = batch_stream(data.train, collate, cfg, dist)
    task.eval_data = fixed_batches(data.heldout, collate, cfg.micro_batch_size) or None
    return task


def distill_stats(result, task: DistillTask) -> dict:
    return {"teacher_accuracy": task.teacher_accuracy,
            "teacher_seconds": round(task.teacher_seconds, 2)}


def distill_summary(stats: dict) -> list[tuple]:
    return [("final loss", stats["final_loss"]), *exact_match_summary(stats),
            ("teacher's exact match", stats["teacher_accuracy"])]


DISTILL_METRICS = {"final_loss": "loss", "val_loss": "val_loss", "divergence": "divergence"}


def run_distill(ctx, cfg: DistillConfig, teacher: str, base: str, eval_data: str | None = None):
    """`llmkit distill`: train checkpoint `base` (the student) towards checkpoint `teacher` on the
    chats (or prompts) of --in (default sft_train)."""
    inputs = distill_inputs(ctx, cfg, teacher, base, eval_data)
    run_dir = ctx.workspace.path(ctx.out_name("distill"))

    def prepare() -> Fit:
        student, tokenizer = load_start(inputs.student_step, cfg)
        data = distill_data(tokenizer, inputs.data_art, inputs.eval_art, cfg)
        return Fit(lambda dist: distill_task(student, inputs.teacher_step, data, cfg, tokenizer,
                                             run_dir, dist),
                   tokenizer.path, distill_summary, model=student, start=inputs.student_step,
                   metrics=DISTILL_METRICS, after=distill_stats, stats=data.stats,
                   score=exact_match_scorer(cfg, tokenizer, data.scored))

    return fit_stage(ctx, "distill", cfg, [inputs.student_art, inputs.teacher_art, inputs.data_art,
                                           inputs.eval_art], prepare)
