"""Token shards, the `tokens` artifact: its layout, the writer of one shard and the readers of
the index.

    train/shard-00000.bin       flat uint16 (vocab ≤ 65535) or uint32 token ids: every train
                                document of the shard, each followed by </s>
    val/shard-00000.bin         the same for the val documents
    index/shard-00000.parquet   one row per document of the shard, in input order: id, source,
                                split (train | val), offset and length (tokens, its </s>
                                included) in that split's .bin
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from llmkit.data.arrow import numbers, strings

SPLITS = ("train", "val")
SHARD = "shard-{:05d}"
INDEX = "index"
SHARD_FILES = (*(f"{s}.bin" for s in SPLITS), f"{INDEX}.parquet")  # of a shard's work folder


def split_shards(tokens_dir: Path, split: str) -> list[tuple[int, Path]]:
    """(shard number, .bin file) of every shard of `split`, in shard order."""
    return [(int(p.stem.split("-")[1]), p)
            for p in sorted((Path(tokens_dir) / split).glob("shard-*.bin"))]


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 65535 else "uint32"


class ShardWriter:
    """Tokens appended to `train.bin` / `val.bin` of `directory`, one index row per document
    (`index.parquet`, written in row groups of INDEX_ROWS), and the counts for the manifest."""

    INDEX_ROWS = 1 << 16

    def __init__(self, directory: Path):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.split_type = pa.dictionary(pa.int8(), pa.string())
        self.split_names = strings(list(SPLITS))
        self.schema = pa.schema([("id", pa.string()), ("source", pa.string()),
                                 ("split", self.split_type), ("offset", pa.int64()),
                                 ("length", pa.int64())])
        self.bins = {s: open(directory / f"{s}.bin", "wb") for s in SPLITS}
        self.index = pq.ParquetWriter(directory / f"{INDEX}.parquet", self.schema,
                                      compression="zstd")
        self.pending: list = []
        self.offsets = dict.fromkeys(SPLITS, 0)
        self.stats = {s: {"docs": 0, "tokens": 0, "tokens_by_source": Counter()}
                      for s in SPLITS}

    def add(self, train, val, ids, sources, source_names: list[str], lengths,
            in_val) -> None:
        """Append one batch: its tokens per split, and per document its id, source (an
        arrow string array, or None to use `source_names`), length and split."""
        import numpy as np
        import pyarrow as pa

        offset = np.empty(len(lengths), np.int64)
        for split, tokens, chosen in (("train", train, ~in_val), ("val", val, in_val)):
            self.bins[split].write(memoryview(tokens))
            lens = lengths[chosen]
            offset[chosen] = self.offsets[split] + np.cumsum(lens) - lens
            self.offsets[split] += int(lens.sum())
            self.stats[split]["docs"] += len(lens)
            self.stats[split]["tokens"] += len(tokens)
        for s, n, v in zip(source_names, lengths.tolist(), in_val.tolist()):
            self.stats[SPLITS[v]]["tokens_by_source"][s] += n
        split = pa.DictionaryArray.from_arrays(numbers(in_val.astype(np.int8)),
                                               self.split_names)
        self.pending.append(pa.Table.from_arrays(
            [ids, sources if sources is not None else strings(source_names), split,
             numbers(offset),
             numbers(lengths.astype(np.int64))], schema=self.schema))
        if sum(t.num_rows for t in self.pending) >= self.INDEX_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self.pending:
            self.index.write_table(pa.concat_tables(self.pending))
            self.pending = []

    def close(self) -> dict:
        self._flush()
        for f in self.bins.values():
            f.close()
        self.index.close()
        for st in self.stats.values():
            st["tokens_by_source"] = dict(sorted(st["tokens_by_source"].items()))
        return self.stats


def read_index(tokens_dir: Path, shard: int, split: str):
    """(offset, length, source) numpy arrays of one shard's documents of `split`, in .bin
    order."""
    import numpy as np

    offset, length, codes, names = read_index_codes(tokens_dir, shard, split)
    sources = np.empty(len(names), object)
    sources[:] = names
    return offset, length, sources[codes]


def read_index_codes(tokens_dir: Path, shard: int, split: str):
    """(offset, length, source code) numpy arrays of one shard's documents of `split`, in .bin
    order, and the source names the codes index (what the data loader needs: memory stays
    small with millions of documents)."""
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.ParquetFile(Path(tokens_dir) / INDEX / f"{SHARD.format(shard)}.parquet").read(
        columns=["split", "offset", "length", "source"])
    split_col = table.column("split").combine_chunks()
    chosen = split_col.indices.to_numpy(zero_copy_only=False) == (
        split_col.dictionary.to_pylist().index(split)
        if split in split_col.dictionary.to_pylist() else -1)
    sources = table.column("source").combine_chunks().dictionary_encode()
    codes = sources.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return (table.column("offset").to_numpy()[chosen], table.column("length").to_numpy()[chosen],
            codes[chosen], sources.dictionary.to_pylist())
