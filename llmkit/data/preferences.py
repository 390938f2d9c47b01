"""Preference data for post-training as token batches: pairs (rm, dpo and its variants: a prompt
with a chosen and a rejected reply) and unpaired feedback (kto: a prompt with one completion
labelled desirable or not), and which of the two kinds a dataset holds. Conversations render as
in `llmkit.data.chat`, whose labels (the replies alone) and padding these batches share.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from llmkit.data.chat import IGNORE_INDEX, Example, encode_conversation, padded_array, prompt_messages, truncate
from llmkit.data.io import dataset_files
from llmkit.errors import UserError


@dataclass
class Pair:
    chosen: Example
    rejected: Example
    margin: float = 0.0
    ref_logps: tuple[float, float] | None = None  # the reference's (chosen, rejected) log-probs

    def __len__(self) -> int:
        return max(len(self.chosen), len(self.rejected))


def encode_pair(tokenizer, row: dict, seq_len: int) -> Pair | None:
    """Prompt + chosen and prompt + rejected as assistant replies (labels on the replies);
    None when the prompt leaves no room for a reply within seq_len."""
    prompt = prompt_messages(row)
    sides = []
    for reply in (row["chosen"], row["rejected"]):
        example = truncate(encode_conversation(
            tokenizer, prompt + [{"role": "assistant", "content": reply}]), seq_len)
        if example is None:
            return None
        sides.append(example)
    return Pair(*sides, margin=float(row.get("margin") or 0.0))


def encode_pairs(tokenizer, rows: list[dict], seq_len: int) -> tuple[list[Pair], dict]:
    """The rows' pairs that can teach a preference, and counts of those left out: too long for
    seq_len, or the same tokens on both sides (chosen == rejected, or equal once cut to seq_len),
    which give every preference loss a zero gradient — left out with a warning."""
    pairs = [encode_pair(tokenizer, row, seq_len) for row in rows]
    fitting = [p for p in pairs if p is not None]
    kept = [p for p in fitting if p.chosen.input_ids != p.rejected.input_ids]
    identical = len(fitting) - len(kept)
    if identical:
        print(f"warning: {identical} of {len(rows)} preference pairs have the same chosen and rejected "
              f"reply within seq_len={seq_len} tokens: nothing to learn from, left out", file=sys.stderr)
    return kept, {"pairs": len(kept), "dropped_too_long": len(pairs) - len(fitting),
                  "dropped_identical": identical}


def collate_pairs(pairs: list[Pair], pad_id: int) -> dict:
    """One [2B, T] batch: the B chosen sequences, then the B rejected ones, right-padded
    (+ `ref_logps` [2B] in the same order when the pairs carry them)."""
    seqs = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    width = max(map(len, seqs))
    batch = {"input_ids": padded_array([s.input_ids for s in seqs], pad_id, width),
             "labels": padded_array([s.labels for s in seqs], IGNORE_INDEX, width),
             "attention_mask": padded_array([[1] * len(s) for s in seqs], 0, width),
             "margin": np.array([p.margin for p in pairs], dtype=np.float32)}
    if pairs[0].ref_logps is not None:
        batch["ref_logps"] = np.array([p.ref_logps[0] for p in pairs]
                                      + [p.ref_logps[1] for p in pairs], dtype=np.float32)
    return batch


# -- unpaired feedback (KTO) ---------------------------------------------------------------

@dataclass
class Feedback:
    """One labelled completion: prompt + completion (labels on the completion only), and the same
    prompt with another prompt's completion, a mismatched pair for KTO's KL estimate."""

    example: Example
    prompt_len: int  # tokens before the completion
    desirable: bool
    mismatched: Example | None = None  # set by `mismatch_completions`
    ref_logps: tuple[float, float] | None = None  # the reference's (completion, mismatched) log-probs

    def __len__(self) -> int:
        return max(len(self.example), len(self.mismatched or self.example))


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def encode_feedback(tokenizer, row: dict, seq_len: int) -> Feedback | None:
    """The row's prompt turns then its `completion` as the assistant's reply, labelled on that
    reply alone (an earlier assistant turn of the prompt is context, as in TRL's KTOTrainer); the
    completion starts where the prompt rendered alone stops matching. None when the prompt leaves
    no room for the completion within seq_len."""
    prompt = prompt_messages(row)
    full = encode_conversation(tokenizer, prompt + [{"role": "assistant", "content": row["completion"]}])
    start = common_prefix_length(tokenizer.encode_chat(prompt, add_generation_prompt=True)[0],
                                 full.input_ids)
    example = truncate(Example(full.input_ids, [IGNORE_INDEX] * start + full.labels[start:]), seq_len)
    return None if example is None else Feedback(example, start, bool(row["label"]))


def encode_feedbacks(tokenizer, rows: list[dict], seq_len: int, seed: int) -> tuple[list[Feedback], dict]:
    items = [encode_feedback(tokenizer, row, seq_len) for row in rows]
    kept = [f for f in items if f is not None]
    mismatch_completions(kept, seq_len, seed)
    desirable = sum(f.desirable for f in kept)
    return kept, {"completions": len(kept), "desirable": desirable, "undesirable": len(kept) - desirable,
                  "dropped_too_long": len(items) - len(kept)}


def mismatch_completions(items: list[Feedback], seq_len: int, seed: int) -> None:
    """Give each item its prompt followed by another item's completion, cut to seq_len: the
    completion of the item before it in a seeded shuffle whose prompt differs. TRL rotates the
    completions by one within each batch of the data's order; a shuffle instead, because rows
    unpaired from one preference pair sit side by side and would pair a prompt with its own
    other reply. The partner is fixed here, so the reference's log-probs of the mismatched pair
    can be computed once, before training."""
    order = np.random.default_rng(seed).permutation(len(items)).tolist()
    prompts = [tuple(f.example.input_ids[:f.prompt_len]) for f in items]
    for k, i in enumerate(order):
        j = next((order[k - step] for step in range(1, len(order))
                  if prompts[order[k - step]] != prompts[i]), order[k - 1])
        items[i].mismatched = mismatched_pair(items[i], items[j], seq_len)


def mismatched_pair(mine: Feedback, theirs: Feedback, seq_len: int) -> Example:
    """`mine`'s prompt followed by `theirs`'s completion (labelled), cut to seq_len."""
    ids = mine.example.input_ids[:mine.prompt_len] + theirs.example.input_ids[theirs.prompt_len:]
    labels = [IGNORE_INDEX] * mine.prompt_len + theirs.example.labels[theirs.prompt_len:]
    return Example(ids[:seq_len], labels[:seq_len])


def collate_feedback(items: list[Feedback], pad_id: int) -> dict:
    """The completions [B, T] (`input_ids`, `labels`, `attention_mask`), their mismatched pairs
    [B, T'] (`kl_input_ids`, `kl_labels`), `desirable` [B] (+ `ref_logps` and `ref_kl_logps` [B]
    when the items carry the reference's), right-padded."""
    def padded(seqs, prefix=""):
        width = max(map(len, seqs))
        return {f"{prefix}input_ids": padded_array([s.input_ids for s in seqs], pad_id, width),
                f"{prefix}labels": padded_array([s.labels for s in seqs], IGNORE_INDEX, width)}

    batch = {**padded([f.example for f in items]), **padded([f.mismatched for f in items], "kl_"),
             "attention_mask": padded_array([[1] * len(f.example) for f in items], 0,
                                       max(len(f.example) for f in items)),
             "desirable": np.array([f.desirable for f in items], dtype=np.float32)}
    if items[0].ref_logps is not None:
        batch["ref_logps"] = np.array([f.ref_logps[0] for f in items], dtype=np.float32)
        batch["ref_kl_logps"] = np.array([f.ref_logps[1] for f in items], dtype=np.float32)
    return batch


# -- which kind of post-training data a dataset holds --------------------------------------

KIND_COLUMNS = {"preference": ("prompt", "chosen", "rejected"), "feedback": ("completion", "label")}


def require_dataset_kind(artifacts, kind: str, stage: str) -> None:
    """`require_kind` on each dataset artifact given (None entries skipped), from its schema."""
    import pyarrow.parquet as pq

    for artifact in filter(None, artifacts):
        files = dataset_files(artifact.path)
        if files:
            require_kind(artifact.path, pq.read_schema(files[0]).names, kind, stage)


def require_kind(path, columns, kind: str, stage: str) -> None:
    """Exit 2 when a dataset with `columns` (at `path`) is not of `kind` but of the other kind
    of preference data: name the kind `stage` reads and how to get it."""
    have = next((k for k, need in KIND_COLUMNS.items() if k != kind and set(need) <= set(columns)), None)
    if have is None or set(KIND_COLUMNS[kind]) <= set(columns):
        return
    how = (f"convert it with `llmkit ingest --kind feedback '{path}/part-*.parquet' --out "
           f"feedback_train` (each pair becomes its chosen reply labelled true and its rejected one "
           f"false), then `llmkit {stage} --in feedback_train`" if kind == "feedback" else
           f"train on it as it is with `llmkit kto --in {path}`, or ingest pairs with `llmkit ingest "
           f"--kind preference` (prompt, chosen, rejected)")
    raise UserError(f"{path} is {have} data ({', '.join(KIND_COLUMNS[have])}); `llmkit {stage}` "
                    f"reads {kind} data ({', '.join(KIND_COLUMNS[kind])}): {how}")
