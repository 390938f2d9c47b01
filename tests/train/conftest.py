"""A tiny task for engine tests: a bigram-ish LM on a deterministic token stream.

`python tests/train/conftest.py RUN_DIR '{"max_steps": 6, ...}' [RUN_DIR OPTIONS ...]` runs the
same task in a fresh process (used for kill/resume and torchrun tests); extra keys `kill_at_batch` (SIGKILL itself
when drawing that batch) and `nan_batches` are test hooks, not TrainConfig fields.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # when run as a script
    sys.path.insert(0, str(REPO))

from llmkit.train.config import TrainConfig  # noqa: E402
from llmkit.train.engine import Engine  # noqa: E402
from llmkit.train.task import Task  # noqa: E402
from llmkit.train.distributed import seed_everything  # noqa: E402

VOCAB = 32
STREAM = (np.arange(4096) * 7 + (np.arange(4096) // 64)) % VOCAB  # next token mostly = cur + 7


class TinyLM(nn.Module):
    """Embedding -> residual MLP with dropout -> norm -> head tied to the embedding."""

    def __init__(self, vocab: int = VOCAB, dim: int = 16, dropout: float = 0.1):
        super().__init__()
        self.config = {"vocab": vocab, "dim": dim, "dropout": dropout}
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        nn.init.normal_(self.embed.weight, std=0.1)
        self.gradient_checkpointing = False

    def forward(self, input_ids):
        h = self.embed(input_ids)
        h = h + self.drop(torch.tanh(self.mix(h)))
        return self.head(self.norm(h))


class StreamBatches:
    """Windows of STREAM at positions drawn from (seed, batch index); rank r of w takes global
    batch indices r, r + w, ... so w processes see what one process sees with grad_accum = w."""

    def __init__(self, micro_batch_size: int, seq_len: int = 8, rank: int = 0, world_size: int = 1,
                 seed: int = 0):
        self.micro_batch_size, self.seq_len = micro_batch_size, seq_len
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.index = 0  # batches this rank has drawn

    def __iter__(self):
        while True:
            global_index = self.index * self.world_size + self.rank
            starts = np.random.default_rng([self.seed, global_index]).integers(
                0, len(STREAM) - self.seq_len - 1, self.micro_batch_size)
            window = np.stack([STREAM[s:s + self.seq_len + 1] for s in starts])
            self.index += 1
            yield {"input_ids": window[:, :-1], "labels": window[:, 1:]}

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, state):
        self.index = state["index"]


class TinyTask(Task):
    def __init__(self, model, train_data, eval_data=None, nan_batches=(), kill_at_batch=None):
        super().__init__(model, train_data, eval_data)
        self.nan_batches = set(nan_batches)  # training batches (1-based) whose loss is made NaN
        self.kill_at_batch = kill_at_batch
        self.batches_drawn = 0
        self.batches_trained = 0  # the engine draws a step's batches before their losses

    def next_batch(self, model):
        self.batches_drawn += 1
        if self.batches_drawn == self.kill_at_batch:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().next_batch(model)

    def loss(self, model, batch):
        logits = model(batch["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten())
        self.batches_trained += model.training
        if model.training and self.batches_trained in self.nan_batches:
            loss = loss * float("nan")
        accuracy = (logits.argmax(-1) == batch["labels"]).float().mean()
        return loss, {"accuracy": accuracy.item()}


def fast_config(**overrides) -> TrainConfig:
    base = dict(max_steps=6, micro_batch_size=4, grad_accum=1, lr=3e-2, min_lr=3e-3, warmup_steps=1,
                weight_decay=0.0, save_every=0, log_every=1, seed=0, peak_flops=1e9)
    return TrainConfig(**{**base, **overrides})


def tiny_transformer():
    """llmkit's model at toy size: GQA, RoPE, tied embeddings (what ZeRO-3 must gather once)."""
    from llmkit.model.transformer import Transformer
    from llmkit.model.config import ModelConfig

    return Transformer(ModelConfig(vocab_size=VOCAB, hidden_size=16, n_layers=2, n_heads=2,
                                   n_kv_heads=1, intermediate_size=32, max_seq_len=16))


def make_engine(run_dir, dropout=0.1, nan_batches=(), kill_at_batch=None, eval_batches=False,
                rank=0, world_size=1, tokenizer_dir=None, init_state_dict=None, transformer=False,
                **cfg) -> Engine:
    """The tiny task on TinyLM (dropout exercises the RNG streams), or on llmkit's Transformer."""
    train_cfg = fast_config(**cfg)
    seed_everything(train_cfg.seed)
    model = tiny_transformer() if transformer else TinyLM(dropout=dropout)
    data = StreamBatches(train_cfg.micro_batch_size, rank=rank, world_size=world_size)
    eval_data = None
    if eval_batches:
        eval_data = lambda: iter(StreamBatches(4, rank=rank, world_size=world_size, seed=99))  # noqa: E731
    task = TinyTask(model, data, eval_data, nan_batches=nan_batches, kill_at_batch=kill_at_batch)
    return Engine(run_dir, train_cfg, task, tokenizer_dir=tokenizer_dir, init_state_dict=init_state_dict)


def main(argv: list[str]) -> None:
    """argv: RUN_DIR OPTIONS_JSON [RUN_DIR OPTIONS_JSON ...], trained one after the other.
    Option `unreadable_on_rank: [rank, step folder]` makes that folder look damaged to that rank
    alone (as a node whose copy of shared storage is stale or broken would see it)."""
    from llmkit.checkpoints import step_folders as ckpt

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    for run_dir, options in zip(argv[::2], argv[1::2]):
        options = json.loads(options)
        blind_rank, hidden = options.pop("unreadable_on_rank", (None, None))
        if blind_rank == rank:
            problem = ckpt.checkpoint_problem
            ckpt.checkpoint_problem = lambda d: "unreadable here" if Path(d).name == hidden else problem(d)
        make_engine(Path(run_dir), rank=rank, world_size=world, **options).fit()


if __name__ == "__main__":
    main(sys.argv[1:])
