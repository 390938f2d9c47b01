"""`llmkit tokenize`: datasets + tokenizer -> token shards with a train/val split.

The artifact::

    tokens/
      tokenizer/                  a copy of the tokenizer that made the shards
      train/shard-00000.bin       flat uint16 (vocab ≤ 65535) or uint32 token ids: every
                                  document of the shard's train split, each followed by </s>
      train/shard-00000.parquet   one row per document: id, source, offset, length (tokens,
                                  its </s> included), in .bin order
      val/...                     the same for the val split
      config.yaml, manifest.json  stats: tokens, docs, per split and per source; dtype, vocab

One shard per input part file, in input order; a document goes to val when the hash of its id
falls below `val_fraction`. So the output is the same for any --workers and any
--rank/--world-size split. With --rank, a task only tokenizes its shards (every
world_size-th) into the workspace's scratch folder; `llmkit tokenize` without --rank then
adds whatever is missing and assembles the artifact.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

from llmkit.errors import ConfigError, UserError

SPLITS = ("train", "val")
SHARD = "shard-{:05d}"
TOKENIZER_DIR = "tokenizer"


@dataclass
class TokenizeConfig:
    val_fraction: float = 0.005  # share of documents (chosen by a hash of the id) in val
    split_seed: int = 0          # salt of that hash: another value picks another val set
    batch_rows: int = 1024       # documents per worker task (memory: a few tasks per worker)

    def __post_init__(self):
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.batch_rows < 1:
            raise ConfigError(f"batch_rows must be ≥ 1, got {self.batch_rows}")


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 65535 else "uint32"


def val_mask(ids: list[str], fraction: float, seed: int):
    """True for the documents of the val split: a stable hash of (seed, id) below `fraction`."""
    import hashlib

    import numpy as np

    limit = int(fraction * 2 ** 64)
    salt = f"{seed}\x1f".encode()
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(salt + i.encode("utf-8", "surrogatepass"),
                                        digest_size=8).digest(), "little") < limit
         for i in ids), bool, len(ids))


# -- one batch, in a worker -----------------------------------------------------------------

_tokenizer = None


def _load_tokenizer(path: str) -> None:
    global _tokenizer
    from llmkit.tokenizer import Tokenizer

    _tokenizer = Tokenizer(path)


def encode_batch(texts: list[str], ids: list[str], cfg: TokenizeConfig, tokenizer=None):
    """(train tokens, val tokens, per-document length incl. </s>, per-document is_val)."""
    import numpy as np

    tok = tokenizer or _tokenizer
    flat, counts = tok.encode_flat([t or "" for t in texts])
    lengths = counts + 1
    ends = np.cumsum(lengths)
    tokens = np.full(int(ends[-1]) if len(ends) else 0, tok.eos_id,
                     np.dtype(token_dtype(tok.vocab_size)))
    body = np.ones(len(tokens), bool)
    body[ends - 1] = False
    tokens[body] = flat
    in_val = val_mask(ids, cfg.val_fraction, cfg.split_seed)
    token_in_val = np.repeat(in_val, lengths)
    return tokens[~token_in_val], tokens[token_in_val], lengths, in_val


def _encode_task(args):
    batch, cfg = args
    texts = batch.column("text").to_pylist()
    return encode_batch(texts, batch.column("id").to_pylist(), cfg)


class _OrderedPool:
    """Runs tasks in this process, or in `workers` processes that each load the tokenizer
    once; results come back in submission order with a few tasks in flight per worker."""

    def __init__(self, workers: int, tokenizer_path: Path):
        self.workers, self.path = workers, str(tokenizer_path)
        self.pool = None

    def __enter__(self):
        if self.workers > 1:
            import multiprocessing as mp

            method = "spawn" if "torch" in sys.modules else "fork"
            self.pool = mp.get_context(method).Pool(self.workers, _load_tokenizer, (self.path,))
        else:
            _load_tokenizer(self.path)
        return self

    def map(self, fn, items):
        if self.pool is None:
            yield from map(fn, items)
            return
        window = deque()
        for item in items:
            window.append(self.pool.apply_async(fn, (item,)))
            if len(window) >= 2 * self.workers:
                yield window.popleft().get()
        while window:
            yield window.popleft().get()

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


# -- one shard ------------------------------------------------------------------------------

def _index_writer(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("id", pa.string()), ("source", pa.string()),
                        ("offset", pa.int64()), ("length", pa.int64())])
    return pq.ParquetWriter(path, schema, compression="zstd")


def tokenize_shard(part: Path, default_source: str, out: Path, pool: _OrderedPool,
                   cfg: TokenizeConfig, progress=None) -> dict:
    """Tokenize one parquet part into `out/` ({split}.bin, {split}.parquet, stats.json);
    `out` appears complete or not at all."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(part)
    names = pf.schema_arrow.names
    if "text" not in names:
        raise UserError(f"{part} has no `text` column; tokenize reads datasets with text")
    columns = ["text"] + [c for c in ("id", "source") if c in names]
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    stats = {s: {"docs": 0, "tokens": 0, "tokens_by_source": Counter()} for s in SPLITS}
    bins = {s: open(tmp / f"{s}.bin", "wb") for s in SPLITS}
    index = {s: _index_writer(tmp / f"{s}.parquet") for s in SPLITS}
    offsets = dict.fromkeys(SPLITS, 0)
    try:
        batches = _with_ids(pf.iter_batches(batch_size=cfg.batch_rows, columns=columns), part)
        held = deque()  # the batches whose results are in flight, for their ids and sources

        def tasks():
            for batch in batches:
                held.append(batch)
                yield batch.select(["id", "text"]), cfg

        for train, val, lengths, in_val in pool.map(_encode_task, tasks()):
            batch = held.popleft()
            ids = batch.column("id").to_pylist()
            sources = (batch.column("source").to_pylist() if "source" in batch.schema.names
                       else [default_source] * batch.num_rows)
            for split, tokens, chosen in (("train", train, ~in_val), ("val", val, in_val)):
                bins[split].write(tokens.tobytes())
                rows = chosen.nonzero()[0].tolist()
                lens = lengths[chosen]
                starts = offsets[split] + lens.cumsum() - lens
                offsets[split] += int(lens.sum())
                src = [sources[i] or default_source for i in rows]
                index[split].write_table(pa.table({
                    "id": [ids[i] for i in rows], "source": src,
                    "offset": starts, "length": lens}, schema=index[split].schema))
                st = stats[split]
                st["docs"] += len(rows)
                st["tokens"] += len(tokens)
                for s, n in zip(src, lens.tolist()):
                    st["tokens_by_source"][s] += n
            if progress is not None:
                progress.advance(batch.num_rows)
    finally:
        for f in bins.values():
            f.close()
        for w in index.values():
            w.close()
    for st in stats.values():
        st["tokens_by_source"] = dict(sorted(st["tokens_by_source"].items()))
    (tmp / "stats.json").write_text(json.dumps(stats))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return stats


def _with_ids(batches, part: Path):
    """Batches with an `id` column (generated from the row number where the dataset has none)."""
    import pyarrow as pa

    row = 0
    for b in batches:
        if "id" not in b.schema.names:
            b = b.append_column("id", pa.array([f"{part.stem}:{row + i}"
                                                for i in range(b.num_rows)]))
        row += b.num_rows
        yield b


# -- the stage ------------------------------------------------------------------------------

def plan_shards(datasets) -> list[tuple[Path, str]]:
    """(part file, source name for rows without one) of every input, in order."""
    from llmkit.data.io import dataset_files

    shards = [(f, art.name) for art in datasets for f in dataset_files(art.path)]
    if not shards:
        raise UserError(f"tokenize: no parquet parts in {', '.join(str(a.path) for a in datasets)}")
    return shards


def run_tokenize(ctx, cfg: TokenizeConfig, tokenizer: str = "tokenizer"):
    from llmkit.data.io import count_rows
    from llmkit.progress import Progress, print_summary
    from llmkit.tokenizer import Tokenizer

    tok_art = ctx.workspace.artifact(tokenizer)
    tok = Tokenizer(tok_art.path)  # fails early on a directory that is not a tokenizer
    datasets = ctx.input_list("dedup")
    b = ctx.workspace.builder(ctx.out_name("tokens"), stage="tokenize", config=cfg,
                              inputs=[tok_art, *datasets], force=ctx.force)
    if b.up_to_date:
        return b
    shards = plan_shards(datasets)
    mine = [k for k in range(len(shards))
            if ctx.rank is None or k % ctx.world_size == ctx.rank]

    def run_shards(work: Path) -> None:
        todo = [k for k in mine if not (work / SHARD.format(k)).is_dir()]
        total = sum(count_rows_of(shards[k][0]) for k in todo)
        with Progress("tokenize", total=total, unit="docs") as bar, \
                _OrderedPool(ctx.workers, tok_art.path) as pool:
            for k in todo:
                part, source = shards[k]
                tokenize_shard(part, source, work / SHARD.format(k), pool, cfg, bar)

    if ctx.rank is not None:
        b.work_dir.mkdir(parents=True, exist_ok=True)
        run_shards(b.work_dir)
        print(f"tokenize: rank {ctx.rank}/{ctx.world_size} done ({len(mine)} of {len(shards)} "
              f"shards in {b.work_dir}); run `llmkit tokenize` without --rank to assemble")
        return b
    with b:
        run_shards(b.work_dir)
        b.stats.update(_assemble(b.work_dir, b.dir, len(shards), tok))
        tok.save(b.dir / TOKENIZER_DIR)
    st = b.stats
    print_summary(f"{b.name} done", [
        ("documents", st["docs"]), ("tokens", st["tokens"]),
        ("train tokens", st["splits"]["train"]["tokens"]),
        ("val tokens", st["splits"]["val"]["tokens"]), ("dtype", st["dtype"]),
        ("seconds", round(time.time() - b.started, 2))])
    return b


def count_rows_of(part: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(part).metadata.num_rows


def _assemble(work: Path, out: Path, n_shards: int, tok) -> dict:
    """Move the finished shards into the artifact; return the manifest's stats."""
    splits = {s: {"docs": 0, "tokens": 0, "tokens_by_source": Counter()} for s in SPLITS}
    for s in SPLITS:
        (out / s).mkdir(parents=True, exist_ok=True)
    for k in range(n_shards):
        src = work / SHARD.format(k)
        shard_stats = json.loads((src / "stats.json").read_text())
        for s in SPLITS:
            os.replace(src / f"{s}.bin", out / s / f"{SHARD.format(k)}.bin")
            os.replace(src / f"{s}.parquet", out / s / f"{SHARD.format(k)}.parquet")
            for key in ("docs", "tokens"):
                splits[s][key] += shard_stats[s][key]
            splits[s]["tokens_by_source"].update(shard_stats[s]["tokens_by_source"])
    by_source: Counter = Counter()
    for s in SPLITS:
        by_source.update(splits[s]["tokens_by_source"])
        splits[s]["tokens_by_source"] = dict(sorted(splits[s]["tokens_by_source"].items()))
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
