"""Training batches: `TokenLoader` over token shards (pretraining) and `LengthBucketSampler`
(dynamic batches of about constant tokens, for SFT and preference data).

TokenLoader views each source as one stream of tokens (its documents in shard order, each
ending with </s>) cut into samples of seq_len + 1 tokens. Sample number g of the run comes
from the source that is furthest behind its share p(source) ∝ tokens(source)^temperature —
Megatron's blending, so every prefix of the run matches the mixture to within one sample per
source. Within a source, samples follow a fresh permutation each epoch (seeded by seed,
source, epoch). The sequence of samples depends only on the seed and the data, never on the
number of ranks: global batch k is samples [k·W·B, (k+1)·W·B) and rank r takes its B of
them, so ranks never overlap and a resumed run continues the same sequence.

A staged mixture (`stages`: from sample S on, other weights — the decay phase that upsamples
code or math) restarts the blending's tally at S: from there every prefix matches the stage's
mixture to within one sample per source, while each source goes on through its own permutation
where it stopped (nothing is repeated early because the weights changed).
"""

from __future__ import annotations

import bisect
import json
import zlib
from pathlib import Path
from typing import Iterator, Sequence

from llmkit.checkpoints.step_folders import tokenizer_folder
from llmkit.data.token_shards import SPLITS, read_index_codes, split_shards
from llmkit.errors import ConfigError, UserError
from llmkit.tokenizers.sentencepiece import tokenizer_file


class _Stream:
    """Tokens of some documents, read as one sequence that wraps around at its end."""

    def __init__(self, arrays: list, shard, start, length):
        import numpy as np

        self._arrays = arrays
        # plain lists: a read is a bisect and a slice, cheaper than numpy calls on scalars
        self._shard, self._start, self._len = shard.tolist(), start.tolist(), length.tolist()
        self._end = np.cumsum(length).tolist()
        self.tokens = self._end[-1] if self._end else 0

    def read(self, pos: int, n: int):
        import numpy as np

        out = np.empty(n, np.int64)
        done = 0
        while done < n:
            p = (pos + done) % self.tokens
            seg = bisect.bisect_right(self._end, p)
            off = p - (self._end[seg] - self._len[seg])
            take = min(self._len[seg] - off, n - done)
            begin = self._start[seg] + off
            out[done:done + take] = self._arrays[self._shard[seg]][begin:begin + take]
            done += take
        return out

    def samples(self, seq_len: int) -> int:
        """Samples of seq_len + 1 tokens (the last may wrap when the stream is short)."""
        return 0 if self.tokens == 0 else max(1, (self.tokens - 1) // seq_len)


def tokenizer_of(tokens_art, workspace):
    """The tokenizer artifact the token shards were made with (an input in their manifest: a
    tokenizer, or the checkpoint run that carries it) and the tokenizer folder itself."""
    for entry in tokens_art.manifest.get("inputs", []):
        path = Path(entry["path"])
        if path.is_dir() and tokenizer_file(tokenizer_folder(path)) is not None:
            return workspace.artifact(path), tokenizer_folder(path)
    raise UserError(f"{tokens_art.path} does not name the tokenizer it was built with; rebuild it "
                    "with `llmkit tokenize`")


def split_tokens(tokens_dir: Path, split: str):
    """Every token of a split (its documents in order, each ending with </s>) as one array."""
    import numpy as np

    arrays = _open_split(Path(tokens_dir), split)[1]
    return np.concatenate(arrays) if arrays else np.empty(0, np.int64)


def _open_split(tokens_dir: Path, split: str):
    """Memory-mapped shards of a split, and per document: shard, offset, length, source code;
    and the source names (sorted) that the codes index."""
    import numpy as np

    try:
        manifest = json.loads((tokens_dir / "manifest.json").read_text())
        dtype = np.dtype(manifest["stats"]["dtype"])
    except (OSError, ValueError, KeyError):
        raise UserError(f"{tokens_dir} is not a complete token artifact (no manifest with a "
                        "dtype); build it with `llmkit tokenize`") from None
    if split not in SPLITS:
        raise UserError(f"no split {split!r} in {tokens_dir}; splits: train, val")
    arrays, shard, offset, length, codes = [], [], [], [], []
    code_of: dict[str, int] = {}
    for k, (number, path) in enumerate(split_shards(tokens_dir, split)):
        size = path.stat().st_size // dtype.itemsize
        arrays.append(np.memmap(path, dtype, mode="r", shape=(size,)) if size
                      else np.empty(0, dtype))
        off, n, local, names = read_index_codes(tokens_dir, number, split)
        shard.append(np.full(len(n), k, np.int64))
        offset.append(off)
        length.append(n)
        to_global = np.array([code_of.setdefault(x, len(code_of)) for x in names], np.int64)
        codes.append(to_global[local] if len(local) else local)
    names = sorted(code_of)
    rank = np.array([names.index(n) for n in code_of], np.int64)  # first seen -> sorted
    cat = (lambda xs: np.concatenate(xs) if xs else np.empty(0, np.int64))
    code = cat(codes)
    return manifest, arrays, cat(shard), cat(offset), cat(length), \
        (rank[code] if len(code) else code), names


def _runs(shard, offset, length, keep):
    """Merge consecutive kept documents (`keep`: their indices, in order) that are contiguous
    in one shard into segments."""
    import numpy as np

    shard, offset, length = shard[keep], offset[keep], length[keep]
    if len(shard) == 0:
        return shard, offset, length
    new = np.ones(len(shard), bool)
    new[1:] = (shard[1:] != shard[:-1]) | (offset[1:] != offset[:-1] + length[:-1])
    starts = np.flatnonzero(new)
    seg_len = np.add.reduceat(length, starts)
    return shard[starts], offset[starts], seg_len


def mixture(tokens: dict[str, int], temperature: float,
            weights: dict[str, float] | None = None) -> dict[str, float]:
    """p(source) ∝ tokens^temperature, or the normalised explicit `weights`."""
    if weights is not None:
        unknown = sorted(set(weights) - set(tokens))
        if unknown:
            raise ConfigError(f"weights name unknown sources {unknown}; sources: "
                              f"{', '.join(sorted(tokens))}")
        if any(w < 0 for w in weights.values()):
            raise ConfigError(f"weights must be ≥ 0, got {weights}")
        raw = {s: float(weights.get(s, 0.0)) if tokens[s] > 0 else 0.0 for s in tokens}
    else:
        if temperature < 0:
            raise ConfigError(f"temperature must be ≥ 0, got {temperature}")
        raw = {s: float(n) ** temperature if n > 0 else 0.0 for s, n in tokens.items()}
    total = sum(raw.values())
    if total <= 0:
        raise ConfigError("the mixture gives every source weight 0 (or no source has tokens)")
    return {s: w / total for s, w in raw.items()}


class TokenLoader:
    """Infinite, resumable, rank-sharded batches of fixed-length sequences.

    Yields {"input_ids": int64 [B, T], "labels": int64 [B, T]} as numpy arrays, where labels
    are the next tokens. `state_dict()` / `load_state_dict()` resume exactly.
    """

    def __init__(self, tokens_dir: str | Path, split: str = "train", *, seq_len: int,
                 micro_batch_size: int, temperature: float = 0.7,
                 weights: dict[str, float] | None = None, seed: int = 0, rank: int = 0,
                 world_size: int = 1, stages: Sequence[tuple[int, dict[str, float]]] = ()):
        import numpy as np

        if seq_len < 1 or micro_batch_size < 1:
            raise ConfigError(f"seq_len and micro_batch_size must be ≥ 1, got {seq_len}, "
                              f"{micro_batch_size}")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in [0, {world_size}), got {rank}")
        self.path, self.split = Path(tokens_dir), split
        self.seq_len, self.micro_batch_size = seq_len, micro_batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.manifest, arrays, shard, offset, length, codes, names = _open_split(self.path,
                                                                                 split)
        self.vocab_size = self.manifest["stats"].get("vocab_size")
        self._all = _Stream(arrays, *_runs(shard, offset, length, np.arange(len(shard))))
        by_source = np.argsort(codes, kind="stable")  # each source's documents, in order
        bounds = np.searchsorted(codes[by_source], np.arange(len(names) + 1))
        streams = {n: _Stream(arrays, *_runs(shard, offset, length,
                                             by_source[bounds[i]:bounds[i + 1]]))
                   for i, n in enumerate(names)}
        self.tokens_by_source = {n: s.tokens for n, s in streams.items()}
        self.probabilities = mixture(self.tokens_by_source, temperature, weights) \
            if streams else {}
        self.stages = [(0, self.probabilities)] + [
            (start, mixture(self.tokens_by_source, temperature, stage_weights))
            for start, stage_weights in stages]
        if any(b[0] <= a[0] for a, b in zip(self.stages, self.stages[1:])):
            raise ConfigError(f"mixture stages must start at increasing samples > 0, got "
                              f"{[start for start, _ in stages]}")
        self.sources = [n for n in names if any(p.get(n, 0) > 0 for _, p in self.stages)]
        self._streams = [streams[n] for n in self.sources]
        self._stage_p = [[p.get(n, 0.0) for n in self.sources] for _, p in self.stages]
        self._n = [s.samples(seq_len) for s in self._streams]
        self._keys = [zlib.crc32(n.encode()) for n in self.sources]
        self._perms: dict[int, tuple[int, object]] = {}
        self.samples_seen = 0
        self._counts = [0] * len(self.sources)  # samples each source gave: where its permutation is
        self._stage_counts = [0] * len(self.sources)  # the same, since the current stage began

    @property
    def tokens(self) -> int:
        return self._all.tokens

    @property
    def tokens_per_step(self) -> int:
        return self.world_size * self.micro_batch_size * self.seq_len

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        if not self.sources:
            raise UserError(f"{self.path}/{self.split} has no tokens to train on")
        import numpy as np

        picks = [self._next_sample() for _ in range(self.world_size * self.micro_batch_size)]
        lo = self.rank * self.micro_batch_size
        rows = np.stack([self._sample_tokens(s, c) for s, c in
                         picks[lo:lo + self.micro_batch_size]])
        return {"input_ids": rows[:, :-1], "labels": rows[:, 1:]}

    def _stage(self, sample: int) -> int:
        return bisect.bisect_right([start for start, _ in self.stages], sample) - 1

    def _next_sample(self) -> tuple[int, int]:
        """The source furthest behind its share in the current stage, and how many samples it
        gave before."""
        stage = self._stage(self.samples_seen)
        start = self.stages[stage][0]
        if self.samples_seen == start and stage:
            self._stage_counts = [0] * len(self.sources)
        p, g = self._stage_p[stage], self.samples_seen - start + 1
        s = max(range(len(p)), key=lambda i: (p[i] * g - self._stage_counts[i], -i))
        c = self._counts[s]
        self._counts[s] += 1
        self._stage_counts[s] += 1
        self.samples_seen += 1
        return s, c

    def _sample_tokens(self, s: int, c: int):
        epoch, j = divmod(c, self._n[s])
        return self._streams[s].read(int(self._permutation(s, epoch)[j]) * self.seq_len,
                                     self.seq_len + 1)

    def _permutation(self, s: int, epoch: int):
        import numpy as np

        cached = self._perms.get(s)
        if cached is None or cached[0] != epoch:
            rng = np.random.default_rng([self.seed, self._keys[s], epoch])
            cached = (epoch, rng.permutation(self._n[s]))
            self._perms[s] = cached
        return cached[1]

    def state_dict(self) -> dict:
        return {"samples_seen": self.samples_seen, "seq_len": self.seq_len, "seed": self.seed,
                "counts": dict(zip(self.sources, self._counts)),
                "stage_counts": dict(zip(self.sources, self._stage_counts))}

    def load_state_dict(self, state: dict) -> None:
        if state["seq_len"] != self.seq_len or state["seed"] != self.seed:
            raise UserError(f"cannot resume the data loader: the checkpoint used seq_len="
                            f"{state['seq_len']}, seed={state['seed']}; this run "
                            f"seq_len={self.seq_len}, seed={self.seed}")
        if set(state["counts"]) != set(self.sources):
            raise UserError("cannot resume the data loader: the token shards' sources changed "
                            f"since the checkpoint ({sorted(state['counts'])} -> {self.sources})")
        self.samples_seen = int(state["samples_seen"])
        self._counts = [int(state["counts"][n]) for n in self.sources]
        stage_counts = state.get("stage_counts", state["counts"])  # a checkpoint from before stages
        self._stage_counts = [int(stage_counts[n]) for n in self.sources]

    def eval_batches(self, n: int | None = None) -> Iterator[dict]:
        """The split in document order as seq_len + 1 windows, every rank's share of each
        global batch; the last global batch wraps around to stay full. At most `n` batches."""
        import numpy as np

        total = self._all.samples(self.seq_len)
        per_step = self.world_size * self.micro_batch_size
        steps = -(-total // per_step)
        if n is not None:
            steps = min(steps, n)
        for step in range(steps):
            first = step * per_step + self.rank * self.micro_batch_size
            rows = np.stack([self._all.read(((first + i) % total) * self.seq_len,
                                            self.seq_len + 1)
                             for i in range(self.micro_batch_size)])
            yield {"input_ids": rows[:, :-1], "labels": rows[:, 1:]}


class LengthBucketSampler:
    """Batches of indices whose padded size (longest length × count) stays ≤ max_tokens.

    Each epoch shuffles the items (seeded by seed and epoch), sorts them by length within
    windows of `window` items, cuts the windows into batches and shuffles the batches; rank r
    takes batch r of every group of world_size. An item longer than max_tokens is a batch of
    its own (the caller truncates). Infinite and resumable through state_dict().
    """

    def __init__(self, lengths: Sequence[int], max_tokens: int, seed: int = 0, *,
                 rank: int = 0, world_size: int = 1, shuffle: bool = True,
                 window: int | None = None, max_batch_size: int | None = None):
        import numpy as np

        self.lengths = np.asarray(lengths, np.int64)
        if len(self.lengths) == 0:
            raise UserError("LengthBucketSampler: no items")
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be ≥ 1, got {max_tokens}")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in [0, {world_size}), got {rank}")
        self.max_tokens, self.seed = max_tokens, seed
        self.rank, self.world_size, self.shuffle = rank, world_size, shuffle
        self.max_batch_size = max_batch_size
        typical = max(1, max_tokens // max(1, int(np.median(self.lengths))))
        self.window = window or 50 * typical
        self.epoch, self.step = 0, 0
        self._batches = self._epoch_batches(0)

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        import numpy as np

        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.lengths)) if self.shuffle else \
            np.arange(len(self.lengths))
        batches: list[list[int]] = []
        for w in range(0, len(order), self.window):
            chunk = order[w:w + self.window]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batch: list[int] = []
            for i, n in zip(chunk.tolist(), self.lengths[chunk].tolist()):
                full = (len(batch) + 1) * n > self.max_tokens or (
                    self.max_batch_size is not None and len(batch) >= self.max_batch_size)
                if batch and full:
                    batches.append(batch)
                    batch = []
                batch.append(i)
            if batch:
                batches.append(batch)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        steps = len(batches) // self.world_size
        if steps == 0:
            raise UserError(f"LengthBucketSampler: {len(batches)} batches cannot feed "
                            f"{self.world_size} ranks; lower max_tokens or use fewer ranks")
        return batches[:steps * self.world_size]

    def __len__(self) -> int:
        """Steps in the current epoch."""
        return len(self._batches) // self.world_size

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def __next__(self) -> list[int]:
        if self.step >= len(self):
            self.epoch += 1
            self.step = 0
            self._batches = self._epoch_batches(self.epoch)
        batch = self._batches[self.step * self.world_size + self.rank]
        self.step += 1
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step": self.step, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed:
            raise UserError(f"cannot resume the sampler: checkpoint seed {state['seed']}, "
                            f"this run {self.seed}")
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self._batches = self._epoch_batches(self.epoch)
