"""The shared runner of row-filtering data stages (clean, ppl-filter…).

A stage supplies `process_batch(batch, config) -> (kept_table, removed_table)`; removed rows
carry a `reason` column, and the config an `allow_empty` field. The runner streams the input
artifact batch by batch, optionally across worker processes (results kept in input order, so
output is identical for any number of workers), writes kept and removed rows, and records
conservation in the manifest. An output without rows is refused (`require_rows`).
"""

from __future__ import annotations

import time
from collections import Counter
from functools import partial

from llmkit.data.io import DatasetWriter, count_rows, iter_batches
from llmkit.errors import UserError
from llmkit.progress import Progress, data_stage_summary

BATCH_ROWS = 2048


def run_map_stage(ctx, *, stage: str, config, process_batch, input_default: str,
                  out_default: str, batch_rows: int = BATCH_ROWS, extra_stats=None):
    src = ctx.input(input_default)
    b = ctx.workspace.builder(ctx.out_name(out_default), stage=stage, config=config,
                              inputs=[src], force=ctx.force)
    if b.up_to_date:
        return b
    with b:
        kept_w, removed_w = DatasetWriter(b.dir), DatasetWriter(b.dir / "removed")
        reasons: Counter = Counter()
        first_removed = None
        rows_in = count_rows(src.path)  # from the parts' metadata, not from what the stage returns
        batches = iter_batches(src.path, batch_size=batch_rows)
        fn = partial(process_batch, config=config)
        with Progress(stage, total=rows_in) as bar, _mapper(ctx.workers) as pmap:
            for kept, removed in pmap(fn, batches):
                kept_w.write(kept)
                removed_w.write(removed)
                reasons.update(removed.column("reason").to_pylist())
                if first_removed is None and removed.num_rows:
                    first_removed = f"id {removed.column('id')[0].as_py()!r}"
                bar.advance(kept.num_rows + removed.num_rows)
        rows_out, rows_removed = kept_w.close(), removed_w.close()
        if rows_in != rows_out + rows_removed:  # a bug, never a user error
            raise AssertionError(f"{stage}: rows_in {rows_in} != {rows_out} + {rows_removed}")
        b.stats.update(rows_in=rows_in, rows_out=rows_out, rows_removed=rows_removed,
                       removed_by_reason=dict(sorted(reasons.items())))
        if extra_stats:
            b.stats.update(extra_stats())
        require_rows(stage, b.stats, config.allow_empty, source=str(src.path),
                     first_removed=first_removed)
    data_stage_summary(b.name, b.stats, time.time() - b.started)
    return b


def require_rows(stage: str, stats: dict, allow_empty: bool, *, source: str,
                 first_removed: str | None = None, explain: dict[str, str] | None = None,
                 unit: str = "rows") -> None:
    """Refuse an output without rows, unless `allow_empty`: a UserError naming the stage, its
    input (`source`), the commonest reasons in `stats["removed_by_reason"]` with their counts
    (`explain` turns a reason code into words) and the first removed row. Call it inside the
    builder's `with` block, before the commit, so that nothing is written."""
    if stats["rows_out"] or allow_empty:
        return
    n = stats["rows_in"]
    if n:
        top = sorted(stats.get("removed_by_reason", {}).items(), key=lambda kv: -kv[1])
        why = "; ".join(f"{k} × {(explain or {}).get(r, r)}" for r, k in top[:3])
        if len(top) > 3:
            why += f"; {len(top) - 3} more reasons"
        where = f" (first: {first_removed})" if first_removed else ""
        what = f"no row kept from {n} {unit if n > 1 else unit[:-1]} of {source}: {why}{where}"
    else:
        what = f"no {unit} in {source}"
    raise UserError(f"{stage}: {what}. Nothing was written; fix the input or the settings, or "
                    "accept an empty output with --allow-empty")


def ordered_imap(pool, fn, items, window: int):
    """`pool.imap` that reads at most `window` items ahead of the results, in input order.

    Pool.imap reads its whole input ahead of the workers; a window keeps memory at a few
    batches per worker.
    """
    from collections import deque

    pending = deque()
    for item in items:
        pending.append(pool.apply_async(fn, (item,)))
        if len(pending) >= window:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


class _mapper:
    """`map` in this process, or an order-preserving process pool for workers > 1."""

    def __init__(self, workers: int):
        self.workers = workers
        self.pool = None

    def __enter__(self):
        if self.workers <= 1:
            return map
        import multiprocessing as mp

        self.pool = mp.get_context("spawn" if _torch_loaded() else "fork").Pool(self.workers)
        return lambda fn, items: ordered_imap(self.pool, fn, items, 2 * self.workers)

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def _torch_loaded() -> bool:
    import sys

    # forking a process that has started torch's thread pools can deadlock
    return "torch" in sys.modules
