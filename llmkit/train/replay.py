"""Replay: general data that joins a run's batches, so that learning a task does not erase what
the start model could do (catastrophic forgetting).

- Post-training (`--set replay.prompts=DATASET --set replay.ratio=0.2`): the start model (or
  `replay.model=RUN`) answers the prompts with llmkit's generation engine; its replies are SFT
  rows (self-distillation: no outside data) drawn as `ratio` of the run's micro-batches. SFT trains
  on them with its own loss; DPO, KTO and distill with the mean NLL of the reply tokens (RPO's
  term) on those micro-batches.
- General text (`pretrain --from … --set replay.text=DATASET`, and `sft`): a text dataset's
  `text` tokenised with the run's tokenizer, or a tokens artifact's train split (never its val
  documents), cut into `seq_len` windows, is that share of the batches. SFT takes the loss on
  every token of them (InstructGPT's pretraining mix), so a fine-tuned model keeps modelling text.

The replies are a workspace artifact, built or reused per prompt (`llmkit.train.replay_replies`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from llmkit.checkpoints.loading import load_tokenizer
from llmkit.data.chat import BatchStream, collate_sft, encode_sft_rows, sft_rows
from llmkit.data.input_files import eval_input, read_rows
from llmkit.data.loader import split_tokens, tokenizer_of
from llmkit.errors import ConfigError, UserError
from llmkit.tokenizers.sentencepiece import open_tokenizer, same_tokenizer
from llmkit.train.replay_replies import replay_replies
from llmkit.train.task import ITEMS_PER_MICRO_BATCH

REPLAY_STAGES = ("sft", "dpo", "kto", "distill", "pretrain")  # stages whose model returns logits
TEXT_STAGES = ("pretrain", "sft")  # stages whose own loss trains on every labelled token


@dataclass
class ReplayConfig:
    prompts: str | None = None  # post-training: dataset or file of prompts (`prompt` or `messages`) the start model answers; its replies join the batches
    text: str | None = None  # pretrain/sft: general text that joins the batches: a dataset or file with `text`, or a tokens artifact (its train split)
    ratio: float = 0.2  # share of the micro-batches drawn from the replay data, in (0, 1)
    model: str | None = None  # the run that answers the prompts; None = the run's start
    max_new_tokens: int = 48  # reply length limit
    temperature: float = 0.0  # 0 = greedy replies
    seed: int = 0  # sampling seed (temperature > 0)
    batch_size: int = 16  # prompts generated together; each batch is kept as it finishes

    def __post_init__(self):
        if self.prompts is not None and self.text is not None:
            raise ConfigError("replay.prompts and replay.text: give one (prompts for post-training, "
                              "text for continued pretraining)")
        if not 0 < self.ratio < 1:
            raise ConfigError(f"replay.ratio must be in (0, 1), got {self.ratio}")
        if self.max_new_tokens < 1 or self.batch_size < 1 or self.temperature < 0:
            raise ConfigError("replay.max_new_tokens and replay.batch_size must be >= 1, "
                              "replay.temperature >= 0")

    @property
    def enabled(self) -> bool:
        return self.prompts is not None or self.text is not None


# -- the inputs, checked before anything is written -----------------------------------------

def replay_input(ctx, stage: str, cfg):
    """The artifact of replay.prompts / replay.text (a run input: a changed file makes the run
    stale), checked for the columns it needs; None without replay. UserError (exit 2) naming
    the setting for a stage that cannot replay or a dataset of the wrong kind."""

    rc = cfg.replay
    if not rc.enabled:
        return None
    if stage not in REPLAY_STAGES:
        raise ConfigError(f"replay: `llmkit {stage}` does not take replay (it trains a "
                          f"{'reward head' if stage == 'rm' else 'policy from its own rollouts'}); "
                          f"replay is a setting of {', '.join(REPLAY_STAGES)}")
    key, spec = ("replay.text", rc.text) if rc.text is not None else ("replay.prompts", rc.prompts)
    if stage == "pretrain" and key == "replay.prompts":
        raise ConfigError("replay.prompts: pretraining replays general text; use replay.text=DATASET")
    if stage not in TEXT_STAGES and key == "replay.text":
        raise ConfigError(f"replay.text: `llmkit {stage}` replays the start model's replies; "
                          "use replay.prompts=DATASET")
    art = eval_input(ctx.workspace, spec)
    if key == "replay.text" and art.stage == "tokenize":
        return art  # its tokenizer is checked against the run's once the run's start is known
    rows = read_rows(art, 1)
    if not rows:
        raise UserError(f"{key}={spec}: no rows")
    need = ("text",) if key == "replay.text" else ("prompt", "messages")
    if not any(rows[0].get(c) for c in need):
        raise UserError(f"{key}={spec}: its rows have no {' or '.join(f'`{c}`' for c in need)} "
                        f"column ({', '.join(sorted(rows[0]))}); "
                        + ("give a text dataset (ingest --kind text)" if key == "replay.text"
                           else "give a prompt or SFT dataset (prompt, or messages)"))
    return art


# -- the batches -----------------------------------------------------------------------------

def text_windows(tokenizer, art, width: int):
    """Windows of `width` tokens (an array, one per row) of `art`: a text dataset's `text`
    tokenised, documents joined by the document end; or a tokens artifact's train split as it is
    (its documents end with </s> already). The last shorter window is dropped."""
    import numpy as np

    if art.stage == "tokenize":
        flat = split_tokens(art.path, "train")
    else:
        end = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
        flat = np.asarray([t for r in read_rows(art) if r.get("text")
                           for t in [*tokenizer.encode(r["text"]), *end]], np.int64)
    n = len(flat) // width
    if n == 0:
        raise UserError(f"replay.text={art.path}: fewer than {width} tokens of text (a window)")
    return flat[:n * width].reshape(n, width)


class WindowStream:
    """Batches of token windows, reshuffled each pass: in pretraining's format ({input_ids,
    labels} shifted by one: windows of seq_len + 1) or, `shifted=False`, in SFT's (labels =
    input_ids, every token labelled). Its position (`state_dict`) resumes exactly."""

    def __init__(self, windows, micro_batch_size: int, seed: int, rank: int, world: int,
                 shifted: bool = True):
        import numpy as np

        self.windows, self.shifted = windows, shifted
        index = np.arange(len(windows))
        self.index = index[rank::world] if len(windows) >= world else index
        self.batch = min(micro_batch_size, len(self.index))
        self.seed, self.epoch, self.pos = seed, 0, 0

    def __iter__(self):
        import numpy as np

        while True:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.index))
            while self.pos + self.batch <= len(order):
                rows = np.asarray(self.windows[self.index[order[self.pos:self.pos + self.batch]]], np.int64)
                self.pos += self.batch
                yield ({"input_ids": rows[:, :-1], "labels": rows[:, 1:]} if self.shifted
                       else {"input_ids": rows, "labels": rows.copy()})
            self.epoch, self.pos = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]


REPLAY = "replay"  # the key that marks a replay micro-batch


def _block_start(j: int, ratio: float) -> int:
    """The first n with floor(n * ratio) >= j."""
    n = max(int(j / ratio) - 1, 0)
    while int(n * ratio) < j:
        n += 1
    return n


class ReplayTask:
    """A stage's Task with replay micro-batches among its own. Micro-batches are cut into blocks
    of about 1/r (block j: the n with floor(n r) = j) and one micro-batch of each block, drawn
    from (seed, j), is a replay one: the share is r at every point of the run (one block at most
    away), no logged step falls always on replay or never (as a fixed period would with
    log_every), and a resumed run draws what the stopped one would have (the count and both
    streams' positions are in `state_dict`). A replay batch in the task's own format (SFT rows or
    text windows for sft, token windows for pretrain) takes the task's loss; for the other
    stages it takes the mean NLL of its reply tokens. Everything else is the task's."""

    def __init__(self, task, replay_data, ratio: float, own_format: bool, pad_id: int | None = None,
                 seed: int = 0):
        self.__dict__.update(task=task, replay_data=replay_data, ratio=ratio, own_format=own_format, seed=seed,
                             replay_pad_id=pad_id, drawn=0, counts_items=None, _replay_iter=None)

    def __getattr__(self, name):
        return getattr(self.__dict__["task"], name)

    def __setattr__(self, name, value):  # the engine sets `device`: the task's
        setattr(self.task, name, value)

    def is_replay(self, n: int) -> bool:
        j = int(n * self.ratio)
        start, end = _block_start(j, self.ratio), _block_start(j + 1, self.ratio)
        draw = int.from_bytes(hashlib.blake2b(f"{self.seed}:{j}".encode(), digest_size=8).digest(), "little")
        return n == start + draw % (end - start)

    def next_batch(self, model):
        n = self.drawn
        self.__dict__["drawn"] = n + 1
        if not self.is_replay(n):
            return self.task.next_batch(model)
        if self._replay_iter is None:
            self.__dict__["_replay_iter"] = iter(self.replay_data)
        try:
            batch = next(self._replay_iter)
        except StopIteration:  # a finite stream: next pass
            self.__dict__["_replay_iter"] = iter(self.replay_data)
            batch = next(self._replay_iter)
        return {**batch, REPLAY: True}

    def items_in_batch(self, batch):
        if not batch.get(REPLAY):
            count = self.task.items_in_batch(batch)
            self.__dict__["counts_items"] = count is not None
            return count
        if self.own_format:
            return self.task.items_in_batch({k: v for k, v in batch.items() if k != REPLAY})
        return int((batch["labels"][:, 1:] != -100).sum()) if self.counts_items else None

    def loss(self, model, batch):
        if not batch.get(REPLAY):
            return self.task.loss(model, batch)
        batch = {k: v for k, v in batch.items() if k != REPLAY}
        if self.own_format:
            loss, _ = self.task.loss(model, batch)
        else:
            from llmkit.train.losses import token_logps

            logps, mask = token_logps(model(batch["input_ids"], batch.get("position_ids"), batch.get("doc_ids")),
                                      batch["labels"])
            loss = -logps.sum() / batch.get(ITEMS_PER_MICRO_BATCH, mask.sum().clamp(min=1))
        return loss, {"replay_loss": loss.detach()}

    def batch_tokens(self, batch) -> int:
        if batch.get(REPLAY) and not self.own_format:
            return int((batch["input_ids"] != self.replay_pad_id).sum())
        return self.task.batch_tokens({k: v for k, v in batch.items() if k != REPLAY})

    def state_dict(self) -> dict:
        state = {**self.task.state_dict(), "replay_drawn": self.drawn}
        if hasattr(self.replay_data, "state_dict"):
            state["replay_data"] = self.replay_data.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.task.load_state_dict({k: v for k, v in state.items() if not k.startswith("replay_")})
        self.__dict__.update(drawn=state.get("replay_drawn", 0), _replay_iter=None)
        if "replay_data" in state:
            self.replay_data.load_state_dict(state["replay_data"])


def require_tokenizer_of_the_run(tokens_art, workspace, tokenizer_dir: Path) -> None:
    """A tokens artifact replays only into a run of the tokenizer that made it: another
    vocabulary's ids would train on garbage, silently."""
    _, theirs = tokenizer_of(tokens_art, workspace)
    if not same_tokenizer(theirs, tokenizer_dir):
        raise ConfigError(f"replay.text={tokens_art.path}: tokenized with {theirs}, but the run trains "
                          f"with another tokenizer ({tokenizer_dir}); tokenize the text with the run's "
                          "tokenizer, or give it as a text dataset")


def replay_source(ctx, stage: str, cfg, fit, art):
    """`wrap(task, dist) -> ReplayTask` over the replay data of `art` (replay.prompts' replies,
    generated or reused here, before the run folder is touched; or replay.text's windows)."""

    rc = cfg.replay
    if rc.text is not None:
        if art.stage == "tokenize":
            require_tokenizer_of_the_run(art, ctx.workspace, fit.tokenizer_dir)
        shifted = stage == "pretrain"  # SFT shifts its labels itself
        windows = text_windows(open_tokenizer(fit.tokenizer_dir), art, cfg.seq_len + shifted)
        fit.stats["replay"] = {"windows": len(windows), "ratio": rc.ratio}
        return lambda task, dist: ReplayTask(
            task, WindowStream(windows, cfg.micro_batch_size, cfg.seed + 1, dist.rank, dist.world_size,
                               shifted=shifted),
            rc.ratio, own_format=True, seed=cfg.seed)

    tokenizer = load_tokenizer(fit.start)
    rows, info = replay_replies(ctx, cfg, art, fit.start, fit.model)
    examples, _ = encode_sft_rows(tokenizer, rows, cfg.seq_len)
    sequences = sft_rows(examples, cfg.seq_len, getattr(cfg, "packing", True))
    fit.stats["replay"] = {**info, "sequences": len(sequences), "ratio": rc.ratio}

    def wrap(task, dist):
        data = BatchStream(sequences, lambda items: collate_sft(items, tokenizer.pad_id),
                           micro_batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len, seed=cfg.seed + 1,
                           rank=dist.rank, world_size=dist.world_size)
        return ReplayTask(task, data, rc.ratio, own_format=stage == "sft", pad_id=tokenizer.pad_id,
                          seed=cfg.seed)

    return wrap
