"""`llmkit tokenize`: datasets + tokenizer -> token shards with a train/val split.

The artifact: the token shards of `llmkit.data.token_shards` (train/, val/, index/), a copy of
the tokenizer that made them (tokenizer/), config.yaml and manifest.json (stats: tokens, docs,
per split and per source; dtype, vocab).

A document is its ids then the document end (after the tokenizer's document start, where that is
not the document end: Llama 3's <|begin_of_text|>). A special token's string inside a document (a
web page quoting <|endoftext|>) is plain text (the tokenizer's `encode_utf8`): the shards hold no
document end but those written after the documents.

One shard per input part file, in input order; a document goes to val when the hash of its id
falls below `val_fraction`. So the output is the same for any --workers, any
--rank/--world-size split and either executor (a shard is a task: `TokenizeTasks`). With
--rank, a run only tokenizes its shards (every world_size-th) into the workspace's scratch
folder; `llmkit tokenize` without --rank then adds whatever is missing and assembles the
artifact.

The scratch folder (`Builder.work_dir`) holds `shard-K/` and its `shard-K.done` marker, which
the driver (llmkit.data.driver) writes last with the stats and the files' sizes. A shard
without an intact marker (killed mid-write, a file lost or cut short, stats that disagree with
the sizes) is tokenized again. Assembly hard-links (or copies) the
shards into the artifact, so a run killed while assembling loses nothing; the scratch folder
goes once the artifact is in place.

With --workers N, this thread reads and writes while N - 1 threads encode (the chunk-cache
encoder's compiled passes release the GIL); N = 1 does everything in this thread.

The hot loop builds arrow arrays from numpy buffers rather than through pyarrow's compute
functions, which import pandas (half a second per process).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from llmkit.checkpoints.step_folders import tokenizer_folder
from llmkit.data.arrow import string_buffers, strings
from llmkit.data.driver import (Assembled, DataConfig, DataStage, Phase, SealedTasks,
                                run_data_stage)
from llmkit.data.io import dataset_files
from llmkit.data.pipeline import ordered_imap
from llmkit.data.token_shards import (INDEX, SHARD, SHARD_FILES, SPLITS, ShardWriter,
                                      token_dtype)
from llmkit.errors import ConfigError, UserError
from llmkit.core.progress import print_summary
from llmkit.tokenizers.sentencepiece import open_tokenizer
from llmkit.core.durable import kill_point, link_or_copy

TOKENIZER_DIR = "tokenizer"


@dataclass
class TokenizeConfig(DataConfig):
    val_fraction: float = 0.005  # share of documents (chosen by a hash of the id) in val
    split_seed: int = 0          # salt of that hash: another value picks another val set
    batch_rows: int = 1024       # documents read from parquet at a time
    task_bytes: int = 1 << 20    # text per worker task (memory: a few tasks per worker)

    def __post_init__(self):
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.batch_rows < 1 or self.task_bytes < 1:
            raise ConfigError(f"batch_rows and task_bytes must be ≥ 1, got {self.batch_rows}, "
                              f"{self.task_bytes}")


def packed_strings(column):
    """(offsets from 0, UTF-8 bytes) of an arrow string column or a list of str: the bytes of
    just these strings, row i at bytes[offsets[i]:offsets[i + 1]]."""
    data, offsets = string_buffers(column)
    return offsets - offsets[0], data[offsets[0]:offsets[-1]]


def val_mask(ids, fraction: float, seed: int):
    """True for the documents of the val split: a hash of (seed, id) below `fraction`.
    `ids`: an arrow string array or a list of str."""
    import numpy as np

    offsets, raw = packed_strings(ids)
    data = raw.astype(np.uint64)
    sizes = np.diff(offsets)
    local = np.arange(len(data)) - np.repeat(offsets[:-1], sizes)
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(int(sizes.max(initial=0)) + 1, 0x100000001B3, np.uint64))
        before = np.concatenate([[np.uint64(0)],
                                 np.cumsum((data + np.uint64(1)) * powers[local])])
        h = before[offsets[1:]] - before[offsets[:-1]]
        h += np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + sizes.astype(np.uint64)
        for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            h = (h ^ (h >> np.uint64(shift))) * np.uint64(factor)  # splitmix64's finaliser
        h ^= h >> np.uint64(31)
    return (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 < fraction


# -- one batch, in an encoder thread --------------------------------------------------------

_local = threading.local()  # each thread's own tokenizer: a chunk cache is not thread-safe


def _take_tokenizer(tokenizers) -> None:
    _local.tokenizer = tokenizers.get_nowait()


def with_prefix(ids, lengths, prefix: list[int]):
    """(ids, lengths) of documents laid end to end, with `prefix` put before each document."""
    import numpy as np

    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else np.zeros(0, np.int64)
    ids = np.insert(ids, np.repeat(starts, len(prefix)), np.tile(np.asarray(prefix, ids.dtype), len(lengths)))
    return ids, lengths + len(prefix)


def encode_documents(batches, cfg: TokenizeConfig, tokenizer=None):
    """Encode the documents of record batches (columns id, text): (train tokens, val tokens,
    per-document length incl. </s> (and the document start, where it is not </s>), per-document
    is_val)."""
    import numpy as np
    import pyarrow as pa

    tok = tokenizer or _local.tokenizer
    texts = [b.column("text") for b in batches]
    offsets, raw = packed_strings(texts[0] if len(texts) == 1 else pa.concat_arrays(texts))
    ids, lengths = tok.encode_utf8(raw, offsets[1:], end_id=tok.eos_id)
    start = tok.document_start_ids()
    if start != [tok.eos_id]:  # Llama 3 begins each document with <|begin_of_text|>; others see </s>
        ids, lengths = with_prefix(ids, lengths, start)
    tokens = ids.astype(token_dtype(tok.vocab_size))
    in_val = np.concatenate([val_mask(b.column("id"), cfg.val_fraction, cfg.split_seed)
                             for b in batches])
    if not in_val.any():
        return tokens, tokens[:0], lengths, in_val
    token_in_val = np.repeat(in_val, lengths)
    return tokens[~token_in_val], tokens[token_in_val], lengths, in_val


def _encode_task(args):
    batches, cfg = args
    return encode_documents(batches, cfg)


class _OrderedPool:
    """Runs tasks in this thread (workers=1), or keeps this thread for reading and writing
    and encodes in workers - 1 threads (the encoder's compiled passes release the GIL);
    results come back in submission order with a few tasks in flight per thread.

    One encoder thread keeps the tokenizer's one chunk cache: two caches would each meet
    every distinct chunk once, so a second encoder thread pays only on a large corpus."""

    def __init__(self, workers: int, tokenizer):
        self.workers, self.tokenizer = workers, tokenizer
        self.pool = None

    def __enter__(self):
        if self.workers > 1:
            import queue
            from multiprocessing.pool import ThreadPool

            encoders = self.workers - 1
            tokenizers = queue.Queue()
            for _ in range(encoders):
                tokenizers.put(self.tokenizer if encoders == 1 else
                               self.tokenizer.for_another_thread())
            self.pool = ThreadPool(encoders, _take_tokenizer, (tokenizers,))
        else:
            _local.tokenizer = self.tokenizer
        return self

    def map(self, fn, items):
        if self.pool is None:
            yield from map(fn, items)
            return
        yield from ordered_imap(self.pool, fn, items, 2 * self.workers)

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


# -- one shard ------------------------------------------------------------------------------

def tokenize_shard(part: Path, default_source: str, out: Path, pool: _OrderedPool,
                   cfg: TokenizeConfig) -> dict:
    """Tokenize one parquet part into the folder `out/` (train.bin, val.bin, index.parquet);
    returns the shard's stats."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(part)
    names = pf.schema_arrow.names
    if "text" not in names:
        raise UserError(f"{part} has no `text` column; tokenize reads datasets with text")
    columns = ["text"] + [c for c in ("id", "source") if c in names]
    writer = ShardWriter(out)
    try:
        batches = _with_ids(pf.iter_batches(batch_size=cfg.batch_rows, columns=columns), part)
        held = deque()  # the tasks' batches whose results are in flight (ids, sources)

        def tasks():
            for group in _grouped(batches, cfg.task_bytes):
                held.append(group)
                yield [b.select(["id", "text"]) for b in group], cfg

        for train, val, lengths, in_val in pool.map(_encode_task, tasks()):
            group = held.popleft()
            ids = pa.concat_arrays([b.column("id") for b in group])
            column = (pa.concat_arrays([b.column("source") for b in group])
                      if "source" in group[0].schema.names else None)
            names = column.to_pylist() if column is not None else [None] * len(ids)
            complete = column is not None and column.type == pa.string() and all(names)
            writer.add(train, val, ids, column if complete else None,
                       [s or default_source for s in names], lengths, in_val)
    finally:
        stats = writer.close()
    return stats


def _grouped(batches, task_bytes: int):
    """Consecutive batches in groups of at least `task_bytes` of text (the last may be less):
    few, large encoder calls even when documents are short."""
    group, size = [], 0
    for b in batches:
        group.append(b)
        size += b.column("text").nbytes
        if size >= task_bytes:
            yield group
            group, size = [], 0
    if group:
        yield group


def _with_ids(batches, part: Path):
    """Batches with a string `id` column (the row number where the dataset has none)."""
    import pyarrow as pa

    row = 0
    for b in batches:
        if "id" not in b.schema.names:
            b = b.append_column("id", strings([f"{part.stem}:{row + i}"
                                               for i in range(b.num_rows)]))
        elif not pa.types.is_string(b.schema.field("id").type) or b.column("id").null_count:
            i = b.schema.get_field_index("id")
            b = b.set_column(i, "id", b.column(i).cast(pa.string()).fill_null(""))
        row += b.num_rows
        yield b


# -- the stage ------------------------------------------------------------------------------

def plan_shards(datasets) -> list[tuple[Path, str]]:
    """(part file, source name for rows without one) of every input, in order."""
    return [(f, art.name) for art in datasets for f in dataset_files(art.path)]  # [] if all empty


@dataclass(frozen=True)
class TokenizeTasks(SealedTasks):
    """Task K tokenizes input part K into `root/shard-K/` (`tokenize_shard`), with the
    tokenizer in `tokenizer_dir` (opened once per process) on `workers` threads; its marker
    holds the shard's stats, which must agree with its files' sizes."""
    root: Path
    shards: list  # (part file, source name for rows without one), as plan_shards gives them
    tokenizer_dir: Path
    cfg: TokenizeConfig
    workers: int
    itemsize: int

    def __len__(self) -> int:
        return len(self.shards)

    def task_name(self, k: int) -> str:
        return SHARD.format(k)

    def accepts(self, k: int, info: dict) -> bool:
        name = self.task_name(k)
        try:
            return set(info["files"]) == {f"{name}/{f}" for f in SHARD_FILES} and all(
                info["stats"][s]["tokens"] * self.itemsize == info["files"][f"{name}/{s}.bin"]
                for s in SPLITS)
        except (KeyError, TypeError):
            return False

    def build(self, k: int, tmp: Path) -> dict:
        part, source = self.shards[k]
        with _OrderedPool(self.workers, tokenizer_in(self.tokenizer_dir)) as pool:
            return {"stats": tokenize_shard(part, source, tmp, pool, self.cfg)}


_TOKENIZERS: dict = {}


def tokenizer_in(folder: Path):
    """The tokenizer of `folder`, opened once per process (its chunk cache stays warm from one
    shard to the next)."""
    key = str(folder)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = open_tokenizer(folder)
    return _TOKENIZERS[key]


def run_tokenize(ctx, cfg: TokenizeConfig, tokenizer: str = "tokenizer"):
    """Run (or resume) tokenize, a task per input part; the Builder, or None for a --rank run."""
    tok_art = ctx.workspace.artifact(tokenizer)  # a tokenizer, or a checkpoint run carrying one
    folder = tokenizer_folder(tok_art.path)
    tok = tokenizer_in(folder)  # fails early on a folder that is not one
    datasets = ctx.input_list("dedup")
    shards = plan_shards(datasets)
    return run_data_stage(ctx, DataStage(
        "tokenize", cfg, [tok_art, *datasets], "tokens",
        [Phase("shards", len(shards), lambda work: TokenizeTasks(
            work.dir, shards, folder, cfg, work.within_task, _itemsize(tok)))],
        lambda out, done: Assembled(_assemble(done["shards"], out, tok)),
        source=", ".join(d.name for d in datasets), work_unit="shards",
        refuse_empty=partial(_refuse_no_token, cfg, datasets), summary=partial(_summary, cfg)))


def _refuse_no_token(cfg: TokenizeConfig, datasets: list, stats: dict) -> None:
    if not stats["tokens"] and not cfg.allow_empty:
        raise UserError(f"tokenize: {', '.join(d.name for d in datasets)} gave no token "
                        f"({stats['docs']} documents); nothing was written. Check the "
                        "inputs, or accept empty shards with --allow-empty")


def _summary(cfg: TokenizeConfig, b) -> None:
    st = b.stats
    if cfg.val_fraction and st["tokens"] and not st["splits"]["val"]["tokens"]:
        print(f"warning: tokenize: the val split is empty (val_fraction={cfg.val_fraction} of "
              f"{st['docs']} documents drew none): training will measure no validation loss; "
              "raise --set val_fraction=…", file=sys.stderr, flush=True)
    print_summary(f"{b.name} done", [
        ("documents", st["docs"]), ("tokens", st["tokens"]),
        ("train tokens", st["splits"]["train"]["tokens"]),
        ("val tokens", st["splits"]["val"]["tokens"]), ("dtype", st["dtype"]),
        ("seconds", round(time.time() - b.started, 2))])


def _itemsize(tok) -> int:
    import numpy as np

    return np.dtype(token_dtype(tok.vocab_size)).itemsize


def _assemble(tasks: TokenizeTasks, out: Path, tok) -> dict:
    """Link the finished shards and a copy of the tokenizer into the artifact; return the
    manifest's stats."""
    splits = {s: {"docs": 0, "tokens": 0, "tokens_by_source": Counter()} for s in SPLITS}
    for d in (*SPLITS, INDEX):
        (out / d).mkdir(parents=True, exist_ok=True)
    n_shards = len(tasks)
    for k in range(n_shards):
        src, name = tasks.folder(k), tasks.task_name(k)
        info = tasks.info(k)
        if info is None:  # damaged since this run tokenized it
            raise UserError(f"{src} changed while tokenize was assembling it; rerun "
                            "`llmkit tokenize`")
        shard_stats = info["stats"]
        for s in SPLITS:
            for key in ("docs", "tokens"):
                splits[s][key] += shard_stats[s][key]
            splits[s]["tokens_by_source"].update(shard_stats[s]["tokens_by_source"])
        for d, f in zip((*SPLITS, INDEX), SHARD_FILES):
            kill_point("tokenize:assemble")
            link_or_copy(src / f, out / d / f"{name}{Path(f).suffix}")
    by_source: Counter = Counter()
    for s in SPLITS:
        by_source.update(splits[s]["tokens_by_source"])
        splits[s]["tokens_by_source"] = dict(sorted(splits[s]["tokens_by_source"].items()))
    tok.save(out / TOKENIZER_DIR)
    return {
        "tokens": sum(splits[s]["tokens"] for s in SPLITS),
        "docs": sum(splits[s]["docs"] for s in SPLITS),
        "tokens_by_source": dict(sorted(by_source.items())),
        "splits": splits,
        "vocab_size": tok.vocab_size,
        "dtype": token_dtype(tok.vocab_size),
        "eos_id": tok.eos_id,
        "shards": n_shards,
    }


