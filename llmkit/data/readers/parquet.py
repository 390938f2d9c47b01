"""Parquet: a record per row, read a batch of `batch_rows` at a time."""

from __future__ import annotations

from pathlib import Path

from llmkit.errors import UserError


def read_parquet(path: Path, cfg):
    import pyarrow.parquet as pq  # heavy: `llmkit --help` must not load it

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a non-parquet file
        raise UserError(f"{path}: not a readable parquet file ({e})") from None
    n = 0
    for batch in pf.iter_batches(batch_size=cfg.batch_rows):
        for rec in batch.to_pylist():
            yield f"{path}#{n}", rec
            n += 1
