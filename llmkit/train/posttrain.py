"""What the post-training stages (sft, rm, dpo, ppo) share: their config defaults, the inputs
and starting checkpoint, reading and holding out rows, preference pairs, the batch stream, the
log-probabilities of labelled tokens, and greedy exact-match scoring before and after training.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from statistics import fmean
from typing import ClassVar

from llmkit.data.chat import BatchStream, prompt_messages, reference_answer
from llmkit.data.preferences import collate_pairs, encode_pairs
from llmkit.data.io import read_table
from llmkit.errors import ConfigError, UserError
from llmkit.checkpoints.loading import load_model, load_tokenizer
from llmkit.model.config import ContextExtension
from llmkit.rewards.verify import verify_rewards
from llmkit.train.config import TrainConfig
from llmkit.model.quant import on_load
from llmkit.train.stage import run_start

# -- configuration -------------------------------------------------------------------------

@dataclass
class PostTrainConfig(TrainConfig):
    """The engine's settings (flat: `--set lr=…`) with the defaults of fine-tuning a trained
    model, plus what every post-training stage reads."""

    max_steps: int = 200  # optimizer steps
    lr: float = 1e-4  # fine-tuning moves a trained model: a lower peak than pretraining
    min_lr: float = 1e-5  # learning rate at the end of the cosine decay
    warmup_steps: int | None = None  # linear warmup steps; None = 10, or 10% of a shorter run
    AUTO_WARMUP: ClassVar[int] = 10
    weight_decay: float = 0.0  # AdamW decay of matrices
    save_every: int = 0  # checkpoint every N steps; 0 = only at the end
    seq_len: int = 512  # longest sequence (conversation, or prompt + reply); longer ones are cut
    eval_fraction: float = 0.05  # share of --in held out for evaluation when --eval is not given
    eval_every: int = 100  # validation loss (and metrics) on held-out batches every N steps
    model: ContextExtension = field(default_factory=ContextExtension)  # RoPE scaling to extend the context

    def __post_init__(self):
        super().__post_init__()
        if self.seq_len < 8:
            raise ConfigError(f"seq_len must be >= 8, got {self.seq_len}")
        if not 0 <= self.eval_fraction < 1:
            raise ConfigError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")


@dataclass
class GenerativeConfig(PostTrainConfig):
    """A stage whose result is a policy, scored by greedy exact match before and after."""

    eval_records: int = 200  # held-out rows scored by exact match at the start and end; 0 = skip
    max_new_tokens: int = 32  # generation budget of that evaluation

    def __post_init__(self):
        super().__post_init__()
        if self.eval_records < 0 or self.max_new_tokens < 1:
            raise ConfigError("eval_records must be >= 0 and max_new_tokens >= 1")


# -- the starting checkpoint ---------------------------------------------------------------

DEFAULT_DATA = {"sft": "sft_train", "rm": "pref_train", "dpo": "pref_train", "kto": "feedback_train",
                "ppo": "prompts_train"}


def post_training_inputs(ctx, stage: str, cfg, base: str, eval_data: str | None):
    """(start artifact, its step folder, data artifact, --eval artifact or None) of `stage`
    fine-tuning checkpoint `base` (a continued LoRA run: the base it pinned) on --in (default
    `DEFAULT_DATA[stage]`)."""
    base_art, base_step = run_start(ctx, stage, cfg, base)
    data_art = ctx.input(default=DEFAULT_DATA[stage])
    return base_art, base_step, data_art, ctx.workspace.artifact(eval_data) if eval_data else None


def load_start(step_dir, cfg: PostTrainConfig):
    """(model, tokenizer) of the checkpoint a post-training run starts from; seq_len must fit."""
    from llmkit.model.rope import extend_context

    model, step_dir = load_model(step_dir, quantize=on_load(cfg.lora, cfg.torch_dtype))
    extend_context(model, cfg.model)
    check_seq_len(cfg, model)
    return model, load_tokenizer(step_dir)


def check_seq_len(cfg: PostTrainConfig, model) -> None:
    if cfg.seq_len > model.config.max_seq_len:
        raise ConfigError(f"seq_len={cfg.seq_len} exceeds the model's max_seq_len="
                          f"{model.config.max_seq_len}; use --set seq_len={model.config.max_seq_len}")


# -- data ----------------------------------------------------------------------------------

def read_rows(artifact, required: tuple[str, ...]) -> list[dict]:
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
    pairs: list  # the training rows encoded (`llmkit.data.preferences.Pair`)
    eval_pairs: list  # the held-out rows encoded
    counts: dict  # what encoding the training rows kept and dropped
    collate: Callable[[list], dict]  # pairs -> padded batch


def preference_data(tokenizer, data_art, eval_art, cfg: PostTrainConfig) -> PreferenceData:
    """Rows of `data_art`, held out as `split_rows` does (the --eval artifact when given),
    encoded as chat pairs that fit `cfg.seq_len`."""
    train_rows, heldout = heldout_split(data_art, eval_art, cfg, ("prompt", "chosen", "rejected"))
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


def heldout_split(data_art, eval_art, cfg: PostTrainConfig,
                  required: tuple[str, ...] = ()) -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows of `data_art`, held out as `split_rows` does (`eval_art` when given)."""
    return split_rows(read_rows(data_art, required), read_rows(eval_art, required) if eval_art else None,
                      cfg.eval_fraction, cfg.seed)


def batch_stream(items: list, collate, cfg: PostTrainConfig, dist):
    """Shuffled micro-batches of `items` for this process (`llmkit.data.chat.BatchStream`)."""
    return BatchStream(items, collate, micro_batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len,
                       seed=cfg.seed, rank=dist.rank, world_size=dist.world_size)


# -- evaluation during a run ---------------------------------------------------------------

def holds_whole_model(cfg: TrainConfig, dist) -> bool:
    """Whether this process can score the trained model: the main one, unless ZeRO-3 over several
    processes leaves none of them the whole model."""
    return dist.is_main and not (cfg.zero_stage == 3 and dist.world_size > 1)


def exact_match_scorer(cfg: GenerativeConfig, tokenizer, records: list[dict]):
    """`score(model, dist) -> {"accuracy": exact match or None}` (None where the process does not
    hold the whole model, see `holds_whole_model`), for `Fit.score`."""

    def score(model, dist):
        if not holds_whole_model(cfg, dist):
            return {"accuracy": None}
        accuracy = evaluate_exact_match(model, tokenizer, records, cfg.max_new_tokens)
        return {"accuracy": None if accuracy is None else round(accuracy, 4)}

    return score


def exact_match_summary(stats: dict) -> list[tuple]:
    """The summary line of a stage scored by `exact_match_scorer`."""
    return [("held-out exact match",
             f"{stats['base_accuracy']} -> {stats['accuracy']} ({stats['eval_records']} rows)")]


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
    # position t predicts token t + 1; through the model's forward (see llmkit.model.transformer: ZeRO-3)
    logits = model(input_ids, position_ids, doc_ids, logits_at=F.pad(mask, (0, 1), value=False))
    picked = targets[mask]
    logps = logits.gather(-1, picked[:, None]).squeeze(-1) - logits.logsumexp(-1)
    rows = mask.nonzero()[:, 0]
    return logps, rows, logits.argmax(-1) == picked


# -- generation and exact match ------------------------------------------------------------

def generate_replies(model, tokenizer, conversations: list[list[dict]], max_new_tokens: int,
                     batch_size: int = 64) -> list[str]:
    """Greedy replies (text up to the first stop token) to each conversation's prompt."""
    from llmkit.model.decoding import generate_replies as generate_tokens

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
    reference reply. Comparison is `llmkit.rewards.verify.exact_match` (whitespace-insensitive).
    """
    return evaluate_answers(model, tokenizer, records, max_new_tokens)["exact_match"]


def evaluate_answers(model, tokenizer, records: list[dict], max_new_tokens: int = 32) -> dict:
    """`exact_match` (see `evaluate_exact_match`) and `similarity`, the mean
    `llmkit.rewards.verify.answer_similarity` of the greedy replies: the verifiable reward with partial
    credit, which also moves when a reply gets closer without becoming right."""
    if not records:  # nothing held out: no score (None in the manifest, not NaN, which JSON lacks)
        return {"exact_match": None, "similarity": None}
    replies = generate_replies(model, tokenizer, [prompt_messages(r) for r in records],
                               max_new_tokens)
    answers = [reference_answer(r) for r in records]
    return {"exact_match": fmean(verify_rewards(replies, answers)),
            "similarity": fmean(verify_rewards(replies, answers, partial=True))}
