"""Chat data for post-training: rows as messages, SFT conversations as token batches (preference
pairs and unpaired feedback: `llmkit.data.preferences`).

Conversations are rendered by the tokenizer's chat template (`Tokenizer.encode_chat`):
`<s>` once, then `<|role|>content<|end|>` per turn. `<|end|>` is the end-of-sequence of an
assistant turn — exactly one after each, and a reply is generated until it. Labels follow the
Hugging Face convention: aligned with `input_ids`, `IGNORE_INDEX` wherever the model must not
learn (the system and user turns, every role token), so only assistant content and its
`<|end|>` are trained.

SFT rows can be packed: several conversations share one sequence, each with its own position
ids (from 0) and document id, which the model uses to block attention between them.
Training batches group items of similar length (little padding) through the shared
`LengthBucketSampler`, which an exact resume replays (`BatchStream`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from llmkit.data.loader import LengthBucketSampler
from llmkit.errors import UserError

IGNORE_INDEX = -100
PAD_DOC = -1  # document id of padding: real tokens never attend to it


# -- rows of the datasets -> messages -------------------------------------------------------

def conversation(row: dict) -> list[dict]:
    """The messages of an SFT row: its `messages`, or `prompt` then `response`."""
    messages = row.get("messages")
    if messages:
        out = [{"role": m["role"], "content": m["content"]} for m in messages]
    elif row.get("prompt") is not None and row.get("response") is not None:
        out = [{"role": "user", "content": row["prompt"]},
               {"role": "assistant", "content": row["response"]}]
    else:
        raise UserError(f"row {row.get('id', '')!r}: an SFT row needs `messages` or "
                        "`prompt` and `response`; ingest the data with `llmkit ingest --kind sft`")
    if not any(m["role"] == "assistant" for m in out):
        raise UserError(f"row {row.get('id', '')!r} has no assistant turn to learn")
    return out


def prompt_messages(row: dict) -> list[dict]:
    """The turns a reply is generated for: `messages` up to the last assistant turn, or `prompt`."""
    messages = row.get("messages")
    if messages:
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"),
                   default=len(messages))
        return [{"role": m["role"], "content": m["content"]} for m in messages[:last]]
    return [{"role": "user", "content": row["prompt"]}]


def reference_answer(row: dict) -> str:
    """What a reply is compared to: `answer`, else the reply the data gives (last assistant
    turn, `response` or `chosen`)."""
    if row.get("answer") is not None:
        return row["answer"]
    messages = row.get("messages")
    if messages:
        return [m["content"] for m in messages if m["role"] == "assistant"][-1]
    return row.get("response") if row.get("response") is not None else row["chosen"]


def one_per_prompt(rows: list[dict]) -> list[dict]:
    """The first row of each prompt. A ranked preference list expands to all its pairs, best
    pair first; later pairs have a lesser reply as `chosen`, which is not the answer."""
    seen, out = set(), []
    for row in rows:
        if row.get("prompt") not in seen:
            seen.add(row.get("prompt"))
            out.append(row)
    return out


# what `llmkit ingest --kind K` reads (llmkit.data.ingest), said when no record had that shape
ACCEPTED = {
    "sft": "--kind sft reads `messages` (a list of {role, content} with an assistant turn), or "
           "`prompt` (or `instruction`, + `input`) with `response` (or `output`)",
    "preference": "--kind preference reads `prompt` with `chosen` and `rejected`, or `prompt` "
                  "with `responses` ranked best first",
    "prompt": "--kind prompt reads `prompt` (or `instruction`)",
    "feedback": "--kind feedback reads `prompt` with `completion` and `label` (true/false; TRL's "
                "unpaired preference format, prompt and completion as text or as chat messages), "
                "or `messages` ending in the assistant reply with `label`, or `prompt` with `chosen` "
                "and `rejected` (unpaired: chosen true, rejected false) or ranked `responses` (the "
                "first true, the others false)",
}
SHAPE_REASONS = ("malformed_messages", "malformed_responses", "no_assistant_turn", "record_not_object",
                 "invalid_label")


def shape_hint(kind: str, reasons) -> dict[str, str]:
    """`require_rows`' `explain` for the commonest reason a record did not have `kind`'s shape:
    that reason followed by the shapes the kind reads."""
    shaped = [r for r, _ in reasons.most_common() if kind in ACCEPTED and
              (r.startswith(("missing_", "empty_", "non_string_")) or r in SHAPE_REASONS)]
    return {shaped[0]: f"{shaped[0]} — {ACCEPTED[kind]}"} if shaped else {}


# -- tokenisation --------------------------------------------------------------------------

@dataclass
class Example:
    """One tokenised conversation (or completion): ids and aligned labels."""

    input_ids: list[int]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


def encode_conversation(tokenizer, messages: list[dict]) -> Example:
    ids, mask = tokenizer.encode_chat(messages)
    return Example(ids, [t if m else IGNORE_INDEX for t, m in zip(ids, mask)])


def truncate(example: Example, seq_len: int) -> Example | None:
    """The first seq_len tokens, or None when nothing left in them is trained on."""
    if len(example) <= seq_len:
        return example
    cut = Example(example.input_ids[:seq_len], example.labels[:seq_len])
    return cut if any(t != IGNORE_INDEX for t in cut.labels[1:]) else None


def encode_sft_rows(tokenizer, rows: list[dict], seq_len: int) -> tuple[list[Example], dict]:
    """Tokenised conversations cut to seq_len, and counts of what was cut or dropped."""
    out, truncated, dropped = [], 0, 0
    for row in rows:
        example = encode_conversation(tokenizer, conversation(row))
        kept = truncate(example, seq_len)
        if kept is None:
            dropped += 1
            continue
        truncated += kept is not example
        out.append(kept)
    return out, {"examples": len(out), "truncated": truncated, "dropped_too_long": dropped}


# -- packing -------------------------------------------------------------------------------

def pack(examples: list[Example], seq_len: int) -> list[list[int]]:
    """Groups of example indices whose lengths sum to at most seq_len (best-fit decreasing)."""
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i]))
    room: list[int] = []  # free space of each open pack, kept sorted, with…
    packs_by_room: list[int] = []  # …the pack each entry belongs to
    packs: list[list[int]] = []
    for i in order:
        need = len(examples[i])
        j = bisect.bisect_left(room, need)
        if j == len(room):
            packs.append([i])
            target, left = len(packs) - 1, seq_len - need
        else:
            target, left = packs_by_room.pop(j), room.pop(j) - need
            packs[target].append(i)
        k = bisect.bisect_left(room, left)
        room.insert(k, left)
        packs_by_room.insert(k, target)
    return packs


@dataclass
class PackedRow:
    """Several examples in one sequence: positions restart and doc ids change at each one."""

    input_ids: list[int]
    labels: list[int]
    position_ids: list[int]
    doc_ids: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


def packed_row(examples: list[Example]) -> PackedRow:
    row = PackedRow([], [], [], [])
    for doc, ex in enumerate(examples):
        row.input_ids += ex.input_ids
        # the first token of a document is never a target, so the shift by one in the loss
        # never asks a document to predict the next one's start
        row.labels += [IGNORE_INDEX] + ex.labels[1:]
        row.position_ids += range(len(ex))
        row.doc_ids += [doc] * len(ex)
    return row


# -- batches -------------------------------------------------------------------------------

def padded_array(seqs: list[list[int]], value: int, width: int) -> np.ndarray:
    out = np.full((len(seqs), width), value, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s
    return out


def collate_sft(rows: list, pad_id: int) -> dict:
    """Right-padded arrays; packed rows add position_ids and doc_ids (padding is its own doc)."""
    width = max(map(len, rows))
    batch = {"input_ids": padded_array([r.input_ids for r in rows], pad_id, width),
             "labels": padded_array([r.labels for r in rows], IGNORE_INDEX, width)}
    if isinstance(rows[0], PackedRow):
        batch["position_ids"] = padded_array([r.position_ids for r in rows], 0, width)
        batch["doc_ids"] = padded_array([r.doc_ids for r in rows], PAD_DOC, width)
    return batch


def sft_rows(examples: list[Example], seq_len: int, packing: bool) -> list:
    """The sequences a model trains on: packed rows of several examples, or the examples."""
    if not packing:
        return examples
    return [packed_row([examples[i] for i in group]) for group in pack(examples, seq_len)]


class BatchStream:
    """Collated batches of `items`, grouped by length: `LengthBucketSampler` (which reshuffles
    and regroups each epoch, shards by rank, and whose position `state_dict()` holds, so a
    resumed run draws the batches the stopped one would have) picks each batch's items."""

    def __init__(self, items: list, collate, *, micro_batch_size: int, seq_len: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        if not items:
            raise UserError("no training examples: the dataset is empty after tokenisation")
        self.items, self.collate = items, collate
        self.sampler = LengthBucketSampler(
            [len(x) for x in items], max_tokens=micro_batch_size * seq_len, seed=seed,
            rank=rank, world_size=world_size, max_batch_size=micro_batch_size)

    def __iter__(self):
        for indices in self.sampler:
            yield self.collate([self.items[i] for i in indices])

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def fixed_batches(items: list, collate, batch_size: int) -> list:
    """Every item once, in batches of similar length (evaluation)."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]))
    return [collate([items[i] for i in order[k:k + batch_size]])
            for k in range(0, len(order), batch_size)]
