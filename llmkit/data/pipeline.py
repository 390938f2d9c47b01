"""What the row-filtering data stages (clean, ppl-filter, dedup's filter phase) share.

`SplitWriter` writes a stage's (or a task's) kept rows, its removed rows with their `reason`,
and counts them (`RowCounts`: conservation, removed rows by reason, the first one removed).
A stage split into tasks has each task write its shard with `SplitWriter.task_layout` and
then `link_task_outputs` puts them together; `RowCounts` add up, so the tasks' counts give the
stage's. `require_rows` refuses an output without rows.

`run_map_stage` runs a stage that is a function of each batch:
`process_batch(batch, config) -> (kept_table, removed_table)`, the config having an
`allow_empty` field. It streams the input artifact batch by batch, optionally across worker
processes (results kept in input order, so output is identical for any number of workers).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from llmkit.data.io import DatasetWriter, count_rows, dataset_files, iter_batches, part_path
from llmkit.errors import UserError
from llmkit.progress import Progress, data_stage_summary
from llmkit.workspace import kill_point, link_or_copy

BATCH_ROWS = 2048


@dataclass
class RowCounts:
    """What a row-filtering stage (or one of its tasks) did with its rows."""
    rows_in: int = 0
    rows_out: int = 0
    rows_removed: int = 0
    removed_by_reason: Counter = field(default_factory=Counter)
    first_removed: str | None = None  # e.g. "id 'doc7'", for an error message

    def __add__(self, other: RowCounts) -> RowCounts:
        return RowCounts(self.rows_in + other.rows_in, self.rows_out + other.rows_out,
                         self.rows_removed + other.rows_removed,
                         self.removed_by_reason + other.removed_by_reason,
                         self.first_removed or other.first_removed)

    def check(self, stage: str) -> None:
        """Conservation: every row read was written, kept or removed."""
        if self.rows_in != self.rows_out + self.rows_removed:  # a bug, never a user error
            raise AssertionError(f"{stage}: rows_in {self.rows_in} != {self.rows_out} + "
                                 f"{self.rows_removed}")

    def stats(self) -> dict:
        """The counts as a manifest records them."""
        return {"rows_in": self.rows_in, "rows_out": self.rows_out,
                "rows_removed": self.rows_removed,
                "removed_by_reason": dict(sorted(self.removed_by_reason.items()))}


class SplitWriter:
    """Kept rows as dataset parts in `kept_dir`, removed rows (each with its `reason`) in
    `removed_dir`, and their counts."""

    def __init__(self, kept_dir: Path, removed_dir: Path):
        self.kept, self.removed = DatasetWriter(kept_dir), DatasetWriter(removed_dir)
        self.reasons: Counter = Counter()
        self.first_removed = None

    @classmethod
    def into(cls, directory: Path) -> SplitWriter:
        """A dataset's layout: kept rows in `directory`, removed rows in `directory/removed`."""
        return cls(directory, Path(directory) / "removed")

    @classmethod
    def task_layout(cls, directory: Path) -> SplitWriter:
        """A task's layout (what `link_task_outputs` reads): `directory/kept`, `directory/removed`."""
        return cls(Path(directory) / "kept", Path(directory) / "removed")

    def write(self, kept, removed, reasons: dict[str, int] | None = None) -> None:
        """Write a batch's kept and removed tables; `reasons` counts the removed rows by
        reason where the caller knows them (else they are read from the `reason` column)."""
        self.kept.write(kept)
        self.removed.write(removed)
        self.reasons.update(reasons if reasons is not None
                            else removed.column("reason").to_pylist())
        if self.first_removed is None and removed.num_rows:
            self.first_removed = f"id {removed.column('id')[0].as_py()!r}"

    def close(self, rows_in: int, stage: str) -> RowCounts:
        """Close the files; the counts, checked against the `rows_in` the stage read."""
        counts = RowCounts(rows_in, self.kept.close(), self.removed.close(),
                           +self.reasons, self.first_removed)
        counts.check(stage)
        return counts


def run_map_stage(ctx, *, stage: str, config, process_batch, input_default: str,
                  out_default: str, batch_rows: int = BATCH_ROWS, extra_stats=None):
    src = ctx.input(input_default)
    b = ctx.workspace.builder(ctx.out_name(out_default), stage=stage, config=config,
                              inputs=[src], force=ctx.force)
    if b.up_to_date:
        return b
    with b:
        writer = SplitWriter.into(b.dir)
        rows_in = count_rows(src.path)  # from the parts' metadata, not from what the stage returns
        batches = iter_batches(src.path, batch_size=batch_rows)
        fn = partial(process_batch, config=config)
        with Progress(stage, total=rows_in) as bar, _mapper(ctx.workers) as pmap:
            for kept, removed in pmap(fn, batches):
                writer.write(kept, removed)
                bar.advance(kept.num_rows + removed.num_rows)
        counts = writer.close(rows_in, stage)
        b.stats.update(counts.stats())
        if extra_stats:
            b.stats.update(extra_stats())
        require_rows(stage, b.stats, config.allow_empty, source=str(src.path),
                     first_removed=counts.first_removed)
    data_stage_summary(b.name, b.stats, time.time() - b.started)
    return b


def link_task_outputs(task_dirs: list[Path], out_dir: Path, stage: str) -> None:
    """Link the kept and removed parts that tasks wrote (`SplitWriter.task_layout`) into one
    dataset in `out_dir`, parts renumbered in task order. Links, not moves: the work area
    stays whole until the artifact is committed, so a crash here loses nothing."""
    counts = {"kept": 0, "removed": 0}
    for folder in task_dirs:
        for kind, dest in (("kept", Path(out_dir)), ("removed", Path(out_dir) / "removed")):
            for f in dataset_files(Path(folder) / kind):
                dest.mkdir(parents=True, exist_ok=True)
                kill_point(f"{stage}:assemble")
                link_or_copy(f, part_path(dest, counts[kind]))
                counts[kind] += 1


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
        self.pool = process_context().Pool(self.workers)
        return lambda fn, items: ordered_imap(self.pool, fn, items, 2 * self.workers)

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def process_context():
    """The multiprocessing context for worker processes: fork, but spawn once torch is
    loaded (forking a process that has started torch's thread pools can deadlock)."""
    import multiprocessing as mp
    import sys

    return mp.get_context("spawn" if "torch" in sys.modules else "fork")
