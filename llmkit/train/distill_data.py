"""What `llmkit distill` trains on: chat sequences (their replies are where the student meets the
teacher), the replies the student samples itself (on-policy batches), and the teacher's top-k
logits computed once and stored in the run folder (`teacher_top_k/`), so that a teacher too big
to hold beside the training student is loaded once, read, and freed; a resumed run reads them back.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmkit.data.chat import Example, IGNORE_INDEX, collate_sft, encode_sft_rows, sft_rows
from llmkit.errors import UserError
from llmkit.train.posttrain import heldout_split
from llmkit.train.rollouts import rollout_prompts
from llmkit.train.task import to_device

TOP_K_DIR = "teacher_top_k"  # in the run folder: the stored teacher
COMPLETE = "complete"  # written last in TOP_K_DIR: the files before it are whole


@dataclass
class DistillItem:
    """A training sequence (an `Example` or a packed row), with the teacher's top-k logits and
    their token ids at its labelled positions when they are precomputed."""

    sequence: object
    top_logits: np.ndarray | None = None  # [labelled positions, k + 1] float32, largest first, the
    #                                       rest's bucket last (`distill_losses.teacher_top_k`)
    top_ids: np.ndarray | None = None  # [labelled positions, k] int32

    def __len__(self) -> int:
        return len(self.sequence)

    @property
    def labelled(self) -> int:
        """Positions whose next token is trained on: where a distribution is compared."""
        return sum(t != IGNORE_INDEX for t in self.sequence.labels[1:])


def collate_distill(items: list[DistillItem], pad_id: int) -> dict:
    """`collate_sft` of the sequences, their lengths, and the stored teacher rows in batch order
    (row-major over the labelled positions, as the model's `logits_at` returns them)."""
    batch = collate_sft([it.sequence for it in items], pad_id)
    batch["lengths"] = np.array([len(it) for it in items], dtype=np.int64)
    if items[0].top_logits is not None:
        batch["top_logits"] = np.concatenate([it.top_logits for it in items])
        batch["top_ids"] = np.concatenate([it.top_ids for it in items])
    return batch


@dataclass
class DistillData:
    train: list[DistillItem]
    heldout: list[DistillItem]  # validation-loss sequences (none for prompt-only data)
    scored: list[dict]  # held-out rows scored by exact match
    stats: dict = field(default_factory=dict)


def has_replies(rows: list[dict]) -> bool:
    return any(r.get("messages") or r.get("response") is not None for r in rows)


def distill_data(tokenizer, data_art, eval_art, cfg) -> DistillData:
    """The training and held-out sequences of --in (held out as sft does): its conversations, or
    its prompts alone when it has no replies (then every batch is on-policy)."""
    train_rows, heldout = heldout_split(data_art, eval_art, cfg)
    if not has_replies(train_rows):
        return prompt_data(tokenizer, data_art, train_rows, heldout, cfg)
    examples, counts = encode_sft_rows(tokenizer, train_rows, cfg.seq_len)
    packing = cfg.packing and not cfg.on_policy  # on-policy replies replace one reply per sequence
    train = [DistillItem(s) for s in sft_rows(examples, cfg.seq_len, packing)]
    held = [DistillItem(s) for s in sft_rows(encode_sft_rows(tokenizer, heldout, cfg.seq_len)[0],
                                              cfg.seq_len, packing)]
    scored = heldout[:cfg.eval_records]
    return DistillData(train, held, scored, {**counts, "train_rows": len(train_rows),
                                             "heldout_rows": len(heldout), "sequences": len(train),
                                             "eval_records": len(scored)})


def prompt_data(tokenizer, data_art, train_rows, heldout, cfg) -> DistillData:
    if cfg.on_policy < 1:
        raise UserError(f"{data_art.path} holds prompts without replies, so only the student's own "
                        "replies can be distilled on: add --set on_policy=1, or give an SFT dataset "
                        "(prompt/response or messages) with --in")
    prompts, dropped = rollout_prompts(tokenizer, train_rows, cfg.seq_len - cfg.max_new_tokens,
                                       data_art.path, needs_answer=False)
    train = [DistillItem(Example(p.ids, [IGNORE_INDEX] * len(p.ids))) for p in prompts]
    scored = [r for r in heldout if r.get("answer") is not None][:cfg.eval_records]
    return DistillData(train, [], scored, {"prompts": len(train), "dropped_too_long": dropped,
                                           "train_rows": len(train_rows), "heldout_rows": len(heldout),
                                           "eval_records": len(scored)})


# -- on-policy batches: the student's own replies -------------------------------------------

def prompts_of(batch: dict) -> list[list[int]]:
    """Each row's prompt: its tokens before its last reply (all of them when it has none)."""
    prompts = []
    for ids, labels, length in zip(batch["input_ids"], batch["labels"], batch["lengths"]):
        labelled = np.flatnonzero(labels[:length] != IGNORE_INDEX)
        starts = labelled[np.diff(labelled, prepend=-2) > 1]  # first token of each reply
        prompts.append(ids[:starts[-1] if len(starts) else length].tolist())
    return prompts


def student_replies(module, batch: dict, *, max_new_tokens: int, seq_len: int, temperature: float,
                    stop_ids: list[int], pad_id: int, seed: int, device) -> dict:
    """The batch with each row's last reply replaced by one `module` samples (cut after its first
    stop token), labelled as a reply; `seed` fixes the sample."""
    import torch

    from llmkit.model.decoding import generate, left_pad

    prompts = prompts_of(batch)
    ids, mask = left_pad(prompts, pad_id)
    width = ids.shape[1]
    generator = torch.Generator(device=device).manual_seed(seed)
    was_training = module.training
    module.eval()
    try:
        out = generate(module, ids.to(device), max(1, min(max_new_tokens, seq_len - width)),
                       temperature=temperature, eos_id=stop_ids[0] if stop_ids else None,
                       attention_mask=mask.to(device), generator=generator)
    finally:
        module.train(was_training)
    items = []
    for prompt, reply in zip(prompts, out[:, width:].tolist()):
        cut = min((reply.index(s) + 1 for s in stop_ids if s in reply), default=len(reply))
        items.append(DistillItem(Example(prompt + reply[:cut], [IGNORE_INDEX] * len(prompt) + reply[:cut])))
    return {**collate_distill(items, pad_id), "student_replies": np.ones(1, dtype=np.float32)}


# -- the teacher's top-k, computed once ------------------------------------------------------

def precompute_top_k(teacher, items: list[DistillItem], *, k: int, vocab: int, pad_id: int,
                     batch_size: int, device, temperature: float = 1.0) -> None:
    """Give each item the teacher's k largest logits (over the first `vocab` tokens: the
    student's) and its rest's bucket at `temperature` (`teacher_top_k`) at its labelled
    positions, in one pass. The items hold views of two arrays allocated once: a small array
    kept per item between each batch's large, freed logits fragmented the heap, and the demo's
    51 MB of rows held 3.7 GB of memory to the end of the run."""
    import torch
    import torch.nn.functional as F

    from llmkit.train.distill_losses import teacher_top_k

    order = sorted(range(len(items)), key=lambda i: len(items[i]))
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = [items[i] for i in order[start:start + batch_size]]
            batch = to_device(collate_distill(chunk, pad_id), device)
            mask = batch["labels"][:, 1:] != IGNORE_INDEX
            logits = teacher(batch["input_ids"], batch.get("position_ids"), batch.get("doc_ids"),
                             logits_at=F.pad(mask, (0, 1), value=False))
            values, ids = teacher_top_k(logits[:, :vocab], k, temperature)
            if start == 0:
                give_rows(items, values.shape[-1], ids.shape[-1])
            for item, v, i in zip(chunk, values.split(mask.sum(1).tolist()),
                                  ids.split(mask.sum(1).tolist())):
                item.top_logits[:] = v.float().cpu().numpy()
                item.top_ids[:] = i.cpu().numpy()


def give_rows(items: list[DistillItem], logit_width: int, id_width: int) -> None:
    """Each item's (empty) teacher rows, views of one logits and one ids array in item order."""
    offsets = np.cumsum([0] + [it.labelled for it in items])
    logits = np.empty((offsets[-1], logit_width), dtype=np.float32)
    ids = np.empty((offsets[-1], id_width), dtype=np.int32)
    for n, item in enumerate(items):
        item.top_logits, item.top_ids = logits[offsets[n]:offsets[n + 1]], ids[offsets[n]:offsets[n + 1]]


def store_top_k(folder: Path, items: list[DistillItem]) -> None:
    """Write the items' teacher rows into `folder` (whole or not at all: `complete` comes last)."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    np.save(partial / "logits.npy", np.concatenate([it.top_logits for it in items]))
    np.save(partial / "ids.npy", np.concatenate([it.top_ids for it in items]))
    np.save(partial / "offsets.npy", np.cumsum([0] + [len(it.top_ids) for it in items]))
    (partial / COMPLETE).write_text("")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)


def load_top_k(folder: Path, items: list[DistillItem]) -> bool:
    """Give the items their stored teacher rows; False when none are stored (or not for these
    items: another count of positions)."""
    if not (folder / COMPLETE).is_file():
        return False
    offsets = np.load(folder / "offsets.npy")
    if len(offsets) != len(items) + 1 or any(offsets[n + 1] - offsets[n] != it.labelled
                                             for n, it in enumerate(items)):
        return False
    logits, ids = np.load(folder / "logits.npy"), np.load(folder / "ids.npy")
    for n, item in enumerate(items):
        item.top_logits, item.top_ids = logits[offsets[n]:offsets[n + 1]], ids[offsets[n]:offsets[n + 1]]
    return True
