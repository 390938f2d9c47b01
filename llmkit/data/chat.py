"""Chat data for post-training: SFT conversations and preference pairs as token batches.

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
import sys
from dataclasses import dataclass

import numpy as np

from llmkit.data.io import dataset_files
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

def _padded(seqs: list[list[int]], value: int, width: int) -> np.ndarray:
    out = np.full((len(seqs), width), value, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s
    return out


def collate_sft(rows: list, pad_id: int) -> dict:
    """Right-padded arrays; packed rows add position_ids and doc_ids (padding is its own doc)."""
    width = max(map(len, rows))
    batch = {"input_ids": _padded([r.input_ids for r in rows], pad_id, width),
             "labels": _padded([r.labels for r in rows], IGNORE_INDEX, width)}
    if isinstance(rows[0], PackedRow):
        batch["position_ids"] = _padded([r.position_ids for r in rows], 0, width)
        batch["doc_ids"] = _padded([r.doc_ids for r in rows], PAD_DOC, width)
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


# -- preference pairs ----------------------------------------------------------------------

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
    batch = {"input_ids": _padded([s.input_ids for s in seqs], pad_id, width),
             "labels": _padded([s.labels for s in seqs], IGNORE_INDEX, width),
             "attention_mask": _padded([[1] * len(s) for s in seqs], 0, width),
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
        return {f"{prefix}input_ids": _padded([s.input_ids for s in seqs], pad_id, width),
                f"{prefix}labels": _padded([s.labels for s in seqs], IGNORE_INDEX, width)}

    batch = {**padded([f.example for f in items]), **padded([f.mismatched for f in items], "kl_"),
             "attention_mask": _padded([[1] * len(f.example) for f in items], 0,
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
