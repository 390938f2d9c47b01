"""Phase 4: split each input shard into the rows kept and the duplicates removed."""

from __future__ import annotations

import numpy as np

from llmkit.data.arrow import int64_numpy, repeated_string, rows_where, set_column
from llmkit.data.dedup.phases.base import ShardPhase
from llmkit.data.io import open_parquet
from llmkit.data.pipeline import SplitWriter


class Filter(ShardPhase):
    """One task per input shard S: `filter/part-S/` holds kept/ and removed/ parquet parts
    (removed rows carry `reason` and `duplicate_of`), one batch of rows in memory at a time."""

    name = "filter"

    def run(self, shard: int) -> dict:
        import pyarrow as pa
        import pyarrow.parquet as pq

        plan = self.plan
        removals = pq.ParquetFile(plan.removals_file(shard)).read()
        removed_rows = int64_numpy(removals.column("row"))
        duplicate_of = removals.column("duplicate_of")
        writer = SplitWriter.task_layout(self.temporary(shard))
        pos = 0
        for batch in open_parquet(plan.shards[shard]).iter_batches(
                batch_size=plan.cfg.batch_rows, use_threads=False):
            table = pa.Table.from_batches([batch])
            lo, hi = np.searchsorted(removed_rows, [pos, pos + batch.num_rows])
            drop = np.zeros(batch.num_rows, bool)
            drop[removed_rows[lo:hi] - pos] = True
            gone = rows_where(table, drop)
            gone = set_column(gone, "reason", repeated_string(plan.reason, gone.num_rows))
            gone = set_column(gone, "duplicate_of", duplicate_of.slice(lo, hi - lo))
            writer.write(rows_where(table, ~drop), gone, reasons={plan.reason: gone.num_rows})
            pos += batch.num_rows
        counts = writer.close(pos, "dedup")
        return {"rows_in": counts.rows_in, "rows_out": counts.rows_out,
                "rows_removed": counts.rows_removed}
