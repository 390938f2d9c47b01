"""Supervised fine-tuning (`llmkit sft`): learn the assistant turns of chat conversations.

The loss is the cross-entropy of assistant tokens only (each reply and its `<|end|>`); several
conversations are packed into one sequence with attention blocked between them. The run is
scored before and after training by greedy exact match on held-out rows
(`posttrain.evaluate_exact_match`), recorded as `stats.base_accuracy` and `stats.accuracy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from llmkit.data.chat import IGNORE_INDEX, collate_sft, encode_sft_rows, fixed_batches, sft_rows
from llmkit.dryrun import parameters, plan
from llmkit.train.planning import (dense_attention_mask, lora_split, model_shape, post_training_plan, show,
                                   world_size)
from llmkit.train.posttrain import (GenerativeConfig, batch_stream, exact_match_scorer,
                                    exact_match_summary, heldout_split, labelled_token_logps,
                                    load_start, post_training_inputs)
from llmkit.train.stage import LOSSES, Fit, fit_stage
from llmkit.train.task import ITEMS_PER_MICRO_BATCH, Task


@dataclass
class SftConfig(GenerativeConfig):
    max_steps: int = 300  # optimizer steps
    packing: bool = True  # several conversations per sequence, attention blocked between them


class SftTask(Task):
    """Cross-entropy of the assistant tokens: a mean over the labelled tokens of the whole
    optimizer step (every micro-batch and process), so a micro-batch of short replies weighs no
    more than a full one; a batch served outside training (validation) is its own mean."""

    def __init__(self, model, train_data, eval_data, seq_len: int, pad_id: int):
        super().__init__(model, train_data, eval_data)
        self.seq_len, self.pad_id = seq_len, pad_id

    def items_in_batch(self, batch) -> int:
        return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())

    def loss(self, model, batch):
        logps, _, correct = labelled_token_logps(model, batch["input_ids"], batch["labels"],
                                                 batch.get("position_ids"), batch.get("doc_ids"))
        loss = -logps.sum() / batch.get(ITEMS_PER_MICRO_BATCH, len(logps)) + model.aux_loss
        return loss, {"accuracy": correct.float().mean(), "trained_tokens": float(len(logps))}

    def flops_per_token(self) -> float:
        return self.model.flops_per_token(self.seq_len)


def sft_sequences(tokenizer, rows: list[dict], cfg: SftConfig) -> tuple[list, dict]:
    """(training sequences of `rows` — packed when cfg.packing —, what encoding kept and dropped)."""
    examples, counts = encode_sft_rows(tokenizer, rows, cfg.seq_len)
    return sft_rows(examples, cfg.seq_len, cfg.packing), counts


def sft_summary(stats: dict) -> list[tuple]:
    return [("final loss", stats["final_loss"]), *exact_match_summary(stats)]


def run_sft(ctx, cfg: SftConfig, base: str, eval_data: str | None = None):
    """`llmkit sft`: fine-tune checkpoint `base` on the SFT dataset of --in (default sft_train)."""
    base_art, base_step, data_art, eval_art = post_training_inputs(ctx, "sft", cfg, base, eval_data)

    def prepare() -> Fit:
        model, tokenizer = load_start(base_step, cfg)
        train_rows, heldout = heldout_split(data_art, eval_art, cfg)
        (sequences, counts), collate = (sft_sequences(tokenizer, train_rows, cfg),
                                        partial(collate_sft, pad_id=tokenizer.pad_id))
        eval_batches = fixed_batches(sft_sequences(tokenizer, heldout, cfg)[0], collate,
                                     cfg.micro_batch_size)
        scored = heldout[:cfg.eval_records]
        return Fit(lambda dist: SftTask(model, batch_stream(sequences, collate, cfg, dist),
                                        eval_batches or None, cfg.seq_len, tokenizer.pad_id),
                   tokenizer.path, sft_summary, model=model, start=base_step, metrics=LOSSES,
                   score=exact_match_scorer(cfg, tokenizer, scored),
                   stats={**counts, "train_rows": len(train_rows), "heldout_rows": len(heldout),
                          "sequences": len(sequences), "eval_records": len(scored)})

    return fit_stage(ctx, "sft", cfg, [base_art, data_art, eval_art], prepare)


def plan_sft(ctx, cfg, base: str, eval_data: str | None) -> None:
    """`llmkit sft --dry-run`: what run_sft would do, from the inputs it would read."""
    step_dir, notes, _, _ = post_training_plan(ctx, "sft", cfg, base, eval_data)
    shape, _ = model_shape(step_dir)
    n, world = parameters(shape), world_size()
    sequences = cfg.micro_batch_size * cfg.grad_accum * world
    trainable, base = lora_split(shape, n, cfg)
    show(ctx, plan("sft", shape, trainable=trainable, total=trainable + base, frozen=base,
              saved=trainable if base else None,
              unit="packed sequences" if cfg.packing else "sequences", per_step=sequences, tokens_per_step=sequences * cfg.seq_len,
              sequences=cfg.micro_batch_size, seq_len=cfg.seq_len, cfg=cfg, world_size=world,
              dense_mask=cfg.packing and dense_attention_mask(), notes=notes))
