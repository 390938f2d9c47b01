"""Phase 1: sketch each input shard's documents (their LSH keys and verification payload)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmkit.data.dedup.phases.base import ShardPhase
from llmkit.data.io import open_parquet
from llmkit.errors import UserError


class Signatures(ShardPhase):
    """One task per input shard S: `signatures/part-S/` holds keys.bin (per batch of rows,
    n_keys × rows keys; blocks.npy: each batch's rows) and the verification payload
    (values.bin, and lengths.npy: each document's number of values)."""

    name = "signatures"

    def run(self, shard: int) -> dict:
        plan = self.plan
        pf = open_parquet(plan.shards[shard])
        if "text" not in pf.schema_arrow.names:
            raise UserError(f"{plan.shards[shard]} has no 'text' column; dedup reads datasets "
                            "made by `llmkit ingest`/`clean`")
        n_rows = pf.metadata.num_rows
        tmp = self.temporary(shard)
        lengths = np.zeros(n_rows, np.int64)
        blocks = []
        pos = 0
        with open(tmp / "keys.bin", "wb") as keys, open(tmp / "values.bin", "wb") as values:
            for batch in pf.iter_batches(batch_size=plan.cfg.batch_rows, columns=["text"],
                                         use_threads=False):
                sketch = plan.sketcher(batch.column(0))
                keys.write(np.ascontiguousarray(sketch.keys, np.uint64))
                values.write(np.ascontiguousarray(sketch.values, plan.sketcher.values_dtype))
                lengths[pos:pos + batch.num_rows] = sketch.lengths
                blocks.append(batch.num_rows)
                pos += batch.num_rows
        np.save(tmp / "lengths.npy", lengths)
        np.save(tmp / "blocks.npy", np.array(blocks, np.int64))
        return {"rows": n_rows}


def read_into(f, offset: int, out: np.ndarray) -> None:
    """Fill `out` with the bytes of a signatures file `f` from `offset` on."""
    view = memoryview(out).cast("B")
    f.seek(offset)
    done = 0
    while done < len(view):
        got = f.readinto(view[done:])
        if not got:
            raise UserError(f"{f.name} ends early: the dedup work area is damaged; delete "
                            f"{Path(f.name).parents[2]} and rerun")
        done += got
