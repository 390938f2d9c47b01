"""What the row-filtering data stages (clean, ppl-filter, quality, decontaminate, dedup's
filter phase) share.

`SplitWriter` writes a stage's (or a task's) kept rows, its removed rows with their `reason`,
and counts them (`RowCounts`: conservation, removed rows by reason, the first one removed).
A stage split into tasks has each task write its shard with `SplitWriter.task_layout` and
then `link_task_outputs` puts them together; `RowCounts` add up, so the tasks' counts give the
stage's.

`SplitTasks` makes such a stage one sealed task per input part (llmkit.data.driver runs them).
`map_stage` describes a stage that is a function of each batch: `process_batch(batch, config)
-> (kept_table, removed_table)`. A task streams its part batch by batch, optionally across
worker processes (results kept in input order), so the output is identical for any number of
workers, tasks or ranks.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from llmkit.data.driver import Assembled, DataStage, Phase, SealedTasks, Work
from llmkit.data.io import DatasetWriter, dataset_files, open_parquet, part_path
from llmkit.core.executor import process_context
from llmkit.core.durable import kill_point, link_or_copy

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

    def as_json(self) -> dict:
        return {**self.stats(), "first_removed": self.first_removed}

    @classmethod
    def from_json(cls, info: dict) -> RowCounts:
        return cls(info["rows_in"], info["rows_out"], info["rows_removed"],
                   Counter(info["removed_by_reason"]), info.get("first_removed"))

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


def map_stage(stage: str, config, src, *, out: str, process_batch,
              batch_rows: int = BATCH_ROWS, inputs: list = (), stats=None) -> DataStage:
    """A stage that maps each batch of its input `src` to (kept, removed) tables
    (`process_batch(batch, config)`), as one task per input part (`SplitTasks`), for
    llmkit.data.driver.run_data_stage. `inputs`: artifacts the batches read besides `src`
    (fingerprinted, recorded); `stats(artifact_dir)`: more manifest stats, from the assembled
    artifact."""
    parts = dataset_files(src.path)

    def tasks(work: Work) -> SplitTasks:
        return SplitTasks(stage, work.dir / "split", parts, partial(
            map_part, process_batch=process_batch, config=config, batch_rows=batch_rows,
            workers=work.within_task))

    def assemble(out_dir: Path, done: dict) -> Assembled:
        counts = done[stage].assemble(out_dir)
        return Assembled({**counts.stats(), **(stats(out_dir) if stats else {})},
                         counts.first_removed)

    return DataStage(stage, config, [src, *inputs], out, [Phase(stage, len(parts), tasks)],
                     assemble, source=str(src.path))


def map_part(task: int, part: Path, writer: SplitWriter, *, process_batch, config,
             batch_rows: int, workers: int) -> int:
    """A `SplitTasks` split: `process_batch(batch, config)` over the part's batches, on
    `workers` processes (results in input order); returns the rows read."""
    rows = 0
    fn = partial(process_batch, config=config)
    with _mapper(workers) as pmap:
        for kept, removed in pmap(fn, open_parquet(part).iter_batches(batch_size=batch_rows,
                                                                      use_threads=False)):
            writer.write(kept, removed)
            rows += kept.num_rows + removed.num_rows
            kill_point("map:batch")
    return rows


@dataclass(frozen=True)
class SplitTasks(SealedTasks):
    """A row-filtering stage (or phase) as sealed tasks, one per input part: task K calls
    `split(K, parts[K], writer)`, which writes the part's kept and removed rows to a
    `SplitWriter` and returns the rows it read; the marker holds the counts."""
    stage: str
    root: Path
    parts: list
    split: object

    def __len__(self) -> int:
        return len(self.parts)

    def build(self, k: int, tmp: Path) -> dict:
        writer = SplitWriter.task_layout(tmp)
        return writer.close(self.split(k, self.parts[k], writer), self.stage).as_json()

    def counts(self) -> RowCounts:
        return sum((RowCounts.from_json(self.info(k)) for k in range(len(self))), RowCounts())

    def assemble(self, out_dir: Path) -> RowCounts:
        """Link every task's output into the dataset `out_dir`; the stage's counts."""
        link_task_outputs([self.folder(k) for k in range(len(self.parts))], out_dir, self.stage)
        counts = self.counts()
        counts.check(self.stage)
        return counts


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


def ordered_imap(pool, fn, items, window: int):
    """`pool.imap` that reads at most `window` items ahead of the results, in input order.

    Pool.imap reads its whole input ahead of the workers; a window keeps memory at a few
    batches per worker.
    """
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
