"""Supervised fine-tuning (`llmkit sft`): learn the assistant turns of chat conversations.

The loss is the cross-entropy of assistant tokens only (each reply and its `<|end|>`); several
conversations are packed into one sequence with attention blocked between them. The run is
scored before and after training by greedy exact match on held-out rows
(`evaluate_exact_match`), recorded as `stats.base_accuracy` and `stats.accuracy`.

This module also holds what the post-training stages (sft, rm, dpo, ppo) share: opening the
starting checkpoint and its tokenizer, reading and splitting the data, exact-match scoring, and
the log-probabilities of labelled tokens.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from llmkit.errors import ConfigError, UserError
from llmkit.train.engine import Task, TrainConfig

# -- configuration -------------------------------------------------------------------------

@dataclass
class PostTrainConfig(TrainConfig):
    """The engine's settings (flat: `--set lr=…`) plus what every post-training stage reads."""

    seq_len: int = 512  # longest sequence (conversation, or prompt + reply); longer ones are cut
    eval_fraction: float = 0.05  # share of --in held out for evaluation when --eval is not given
    eval_every: int = 100  # validation loss (and metrics) on held-out batches every N steps

    def __post_init__(self):
        super().__post_init__()
        if self.seq_len < 8:
            raise ConfigError(f"seq_len must be >= 8, got {self.seq_len}")
        if not 0 <= self.eval_fraction < 1:
            raise ConfigError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")

    def train_config(self) -> TrainConfig:
        return TrainConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(TrainConfig)})


@dataclass
class GenerativeConfig(PostTrainConfig):
    """A stage whose result is a policy, scored by greedy exact match before and after."""

    eval_records: int = 200  # held-out rows scored by exact match at the start and end; 0 = skip
    max_new_tokens: int = 32  # generation budget of that evaluation

    def __post_init__(self):
        super().__post_init__()
        if self.eval_records < 0 or self.max_new_tokens < 1:
            raise ConfigError("eval_records must be >= 0 and max_new_tokens >= 1")


@dataclass
class SftConfig(GenerativeConfig):
    max_steps: int = 300  # optimizer steps
    lr: float = 1e-4  # fine-tuning moves a trained model: a lower peak than pretraining
    min_lr: float = 1e-5  # learning rate at the end of the cosine decay
    warmup_steps: int | None = None  # linear warmup steps; None = 10, or 10% of a shorter run
    AUTO_WARMUP: ClassVar[int] = 10
    weight_decay: float = 0.0  # AdamW decay of matrices
    save_every: int = 0  # checkpoint every N steps; 0 = only at the end
    packing: bool = True  # several conversations per sequence, attention blocked between them


# -- the starting checkpoint ---------------------------------------------------------------

def load_start(step_dir, cfg: PostTrainConfig):
    """(model, tokenizer) of the checkpoint a post-training run starts from; seq_len must fit."""
    from llmkit.api import load_model, load_tokenizer

    model, step_dir = load_model(step_dir)
    check_seq_len(cfg, model)
    return model, load_tokenizer(step_dir)


def check_seq_len(cfg: PostTrainConfig, model) -> None:
    if cfg.seq_len > model.config.max_seq_len:
        raise ConfigError(f"seq_len={cfg.seq_len} exceeds the model's max_seq_len="
                          f"{model.config.max_seq_len}; use --set seq_len={model.config.max_seq_len}")


# -- data ----------------------------------------------------------------------------------

def read_rows(artifact, required: tuple[str, ...]) -> list[dict]:
    from llmkit.data.io import read_table

    table = read_table(artifact.path)
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise UserError(f"{artifact.path} has no column {', '.join(missing)}; ingest it with the "
                        "right --kind (sft: prompt/response or messages; preference: prompt/chosen/"
                        "rejected)")
    return table.to_pylist()


@dataclass
class PreferenceData:
    """A preference dataset (prompt/chosen/rejected) read, split and encoded: what rm and dpo
    train and score on."""

    train_rows: list[dict]
    heldout: list[dict]
    pairs: list  # the training rows encoded (`llmkit.data.chat.Pair`)
    eval_pairs: list  # the held-out rows encoded
    counts: dict  # what encoding the training rows kept and dropped
    collate: Callable[[list], dict]  # pairs -> padded batch


def preference_data(tokenizer, data_art, eval_art, cfg: PostTrainConfig) -> PreferenceData:
    """Rows of `data_art`, held out as `split_rows` does (the --eval artifact when given),
    encoded as chat pairs that fit `cfg.seq_len`."""
    from functools import partial

    from llmkit.data.chat import collate_pairs, encode_pairs

    needed = ("prompt", "chosen", "rejected")
    train_rows, heldout = split_rows(read_rows(data_art, needed),
                                     read_rows(eval_art, needed) if eval_art else None,
                                     cfg.eval_fraction, cfg.seed)
    pairs, counts = encode_pairs(tokenizer, train_rows, cfg.seq_len)
    eval_pairs, _ = encode_pairs(tokenizer, heldout, cfg.seq_len)
    return PreferenceData(train_rows, heldout, pairs, eval_pairs, counts,
                          partial(collate_pairs, pad_id=tokenizer.pad_id))


def is_heldout(row_id, fraction: float, seed: int) -> bool:
    digest = hashlib.blake2b(f"{seed}:{row_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0 ** 64 < fraction


def split_rows(rows: list[dict], eval_rows: list[dict] | None, fraction: float,
               seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out): the --eval dataset when given, else a stable share of the rows."""
    if eval_rows is not None:
        return rows, eval_rows
    train = [r for r in rows if not is_heldout(r.get("id"), fraction, seed)]
    return train, [r for r in rows if is_heldout(r.get("id"), fraction, seed)]


# -- evaluation during a run ---------------------------------------------------------------

def exact_match_scorer(cfg: GenerativeConfig, dist, tokenizer, records: list[dict]):
    """`score(model) -> accuracy | None`: exact match on the main process. None under ZeRO-3
    with several processes, where no process holds the whole trained model."""

    def score(model):
        if not dist.is_main or (cfg.zero_stage == 3 and dist.world_size > 1):
            return None
        return round(evaluate_exact_match(model, tokenizer, records, cfg.max_new_tokens), 4)

    return score


# -- log-probabilities of labelled tokens --------------------------------------------------

def labelled_token_logps(model, input_ids, labels, position_ids=None, doc_ids=None):
    """log p of each labelled token (labels != -100) given its prefix, the row it belongs to,
    and whether it is the model's argmax; flat [N] tensors.

    Equal to `losses.token_logps(model(input_ids), labels)` at the labelled positions, but the
    vocabulary projection runs only there: prompts (most tokens in chat data) cost no logits.
    """
    import torch.nn.functional as F

    from llmkit.train.losses import IGNORE_INDEX

    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    # position t predicts token t + 1; through the model's forward (see llmkit.model: ZeRO-3)
    logits = model(input_ids, position_ids, doc_ids, logits_at=F.pad(mask, (0, 1), value=False))
    picked = targets[mask]
    logps = logits.gather(-1, picked[:, None]).squeeze(-1) - logits.logsumexp(-1)
    rows = mask.nonzero()[:, 0]
    return logps, rows, logits.argmax(-1) == picked


# -- generation and exact match ------------------------------------------------------------

def generate_replies(model, tokenizer, conversations: list[list[dict]], max_new_tokens: int,
                     batch_size: int = 64) -> list[str]:
    """Greedy replies (text up to the first stop token) to each conversation's prompt."""
    from llmkit.decoding import generate_replies as generate_tokens

    prompts = [tokenizer.encode_chat(c, add_generation_prompt=True)[0] for c in conversations]
    was_training = model.training
    model.eval()
    try:
        replies = generate_tokens(model, prompts, stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id,
                                  max_new_tokens=max_new_tokens, batch_size=batch_size)
    finally:
        model.train(was_training)
    return [tokenizer.decode(r) for r in replies]


def evaluate_exact_match(model, tokenizer, records: list[dict], max_new_tokens: int = 32) -> float:
    """Share of records whose greedy reply (chat template) equals the record's answer.

    A record is a row of an SFT, preference or prompt dataset: the prompt is its `messages`
    before the last assistant turn, or its `prompt`; the answer is its `answer`, else its
    reference reply. Comparison is `llmkit.rewards.exact_match` (whitespace-insensitive).
    """
    return evaluate_answers(model, tokenizer, records, max_new_tokens)["exact_match"]


def evaluate_answers(model, tokenizer, records: list[dict], max_new_tokens: int = 32) -> dict:
    """`exact_match` (see `evaluate_exact_match`) and `similarity`, the mean
    `llmkit.rewards.answer_similarity` of the greedy replies: the verifiable reward with partial
    credit, which also moves when a reply gets closer without becoming right."""
    from statistics import fmean

    from llmkit.data.chat import prompt_messages, reference_answer
    from llmkit.rewards import verify_rewards

    if not records:
        return {"exact_match": float("nan"), "similarity": float("nan")}
    replies = generate_replies(model, tokenizer, [prompt_messages(r) for r in records],
                               max_new_tokens)
    answers = [reference_answer(r) for r in records]
    return {"exact_match": fmean(verify_rewards(replies, answers)),
            "similarity": fmean(verify_rewards(replies, answers, partial=True))}


# -- the trainer ---------------------------------------------------------------------------

class SftTask(Task):
    """Cross-entropy of the assistant tokens (mean over the micro-batch's labelled tokens)."""

    def __init__(self, model, train_data, eval_data, seq_len: int, pad_id: int):
        super().__init__(model, train_data, eval_data)
        self.seq_len, self.pad_id = seq_len, pad_id

    def loss(self, model, batch):
        logps, _, correct = labelled_token_logps(model, batch["input_ids"], batch["labels"],
                                                 batch.get("position_ids"), batch.get("doc_ids"))
        loss = -logps.mean() + model.aux_loss
        return loss, {"accuracy": correct.float().mean(), "trained_tokens": float(len(logps))}

    def batch_tokens(self, batch) -> int:
        return int((batch["input_ids"] != self.pad_id).sum())

    def flops_per_token(self) -> float:
        return self.model.flops_per_token(self.seq_len)


def run_sft(ctx, cfg: SftConfig, base: str, eval_data: str | None = None):
    """`llmkit sft`: fine-tune checkpoint `base` on the SFT dataset of --in (default sft_train)."""
    from functools import partial

    from llmkit.data.chat import BatchStream, collate_sft, encode_sft_rows, fixed_batches, sft_rows
    from llmkit.progress import print_summary
    from llmkit.train.checkpoint import open_run, training_run
    from llmkit.train.engine import Engine
    from llmkit.train.pretrain import starting_weights

    base_art, base_step = starting_weights(ctx.workspace, base)
    data_art = ctx.input(default="sft_train")
    eval_art = ctx.workspace.artifact(eval_data) if eval_data else None
    inputs = [a for a in (base_art, data_art, eval_art) if a is not None]
    b, plan = open_run(ctx, "sft", cfg, inputs)
    if b.up_to_date:
        return b
    model, tokenizer = load_start(base_step, cfg)
    rows = read_rows(data_art, ())
    train_rows, heldout = split_rows(rows, read_rows(eval_art, ()) if eval_art else None,
                                     cfg.eval_fraction, cfg.seed)
    examples, counts = encode_sft_rows(tokenizer, train_rows, cfg.seq_len)
    sequences = sft_rows(examples, cfg.seq_len, cfg.packing)
    collate = partial(collate_sft, pad_id=tokenizer.pad_id)
    eval_examples, _ = encode_sft_rows(tokenizer, heldout, cfg.seq_len)
    eval_batches = fixed_batches(sft_rows(eval_examples, cfg.seq_len, cfg.packing), collate,
                                 cfg.micro_batch_size)
    scored = heldout[:cfg.eval_records]
    with training_run(b, plan) as dist:
        score = exact_match_scorer(cfg, dist, tokenizer, scored)
        base_accuracy = score(model.to(dist.device))
        stream = BatchStream(sequences, collate, micro_batch_size=cfg.micro_batch_size,
                             seq_len=cfg.seq_len, seed=cfg.seed, rank=dist.rank,
                             world_size=dist.world_size)
        task = SftTask(model, stream, eval_batches or None, cfg.seq_len, tokenizer.pad_id)
        result = Engine(b.final, cfg.train_config(), task, tokenizer_dir=tokenizer.path).fit()
        accuracy = score(model)
        b.stats.update(
            **counts, train_rows=len(train_rows), heldout_rows=len(heldout),
            sequences=len(sequences), steps=result.step, tokens_seen=result.tokens_seen,
            final_loss=result.metrics.get("loss"), val_loss=result.metrics.get("val_loss"),
            eval_records=len(scored), base_accuracy=base_accuracy, accuracy=accuracy)
    if dist.is_main:
        print_summary(f"{b.name} done", [
            ("steps", result.step), ("final loss", result.metrics.get("loss")),
            ("held-out exact match", f"{base_accuracy} -> {accuracy} ({len(scored)} rows)"),
            ("seconds", round(time.time() - b.started, 1))])
    return b
