"""What the row-filtering data stages (clean, ppl-filter, dedup's filter phase) share.

`SplitWriter` writes a stage's (or a task's) kept rows, its removed rows with their `reason`,
and counts them (`RowCounts`: conservation, removed rows by reason, the first one removed).
A stage split into tasks has each task write its shard with `SplitWriter.task_layout` and
then `link_task_outputs` puts them together; `RowCounts` add up, so the tasks' counts give the
stage's. `require_rows` refuses an output without rows.

`SplitTasks` makes such a stage one task per input part, each sealed in the work area when
done, so that any executor (llmkit.executor: here, or Ray) can run them, a --rank run can take
its share, and a rerun skips what is done. `run_map_stage` runs a stage that is a function of
each batch: `process_batch(batch, config) -> (kept_table, removed_table)`, the config having
`allow_empty`, `executor` and `ray` fields. A task streams its part batch by batch, optionally
across worker processes (results kept in input order), so the output is identical for any
number of workers, tasks or ranks.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from llmkit.data.io import (DatasetWriter, dataset_files, fresh_dir, open_parquet, part_path,
                            replace_dir, temporary_path)
from llmkit.errors import UserError
from llmkit.executor import process_context, run_tasks
from llmkit.progress import data_stage_summary
from llmkit.workspace import kill_point, link_or_copy, seal, sealed

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


def run_map_stage(ctx, *, stage: str, config, process_batch, input_default: str,
                  out_default: str, batch_rows: int = BATCH_ROWS, extra_stats=None,
                  extra_inputs: list = ()):
    """Run (or resume) a stage that maps each batch to (kept, removed) tables, as one task per
    input part (`SplitTasks`). With --rank, only this rank's tasks run and nothing is
    committed (returns None); a plain run does what is left and assembles the artifact.
    `extra_inputs`: artifacts the batches read besides the input (fingerprinted, recorded);
    `extra_stats(artifact_dir)`: more manifest stats, from the assembled artifact."""
    src = ctx.input(input_default)
    b = ctx.workspace.builder(ctx.out_name(out_default), stage=stage, config=config,
                              inputs=[src, *extra_inputs], force=ctx.force)
    if b.up_to_date:
        return b
    # locally the batches of a task share --workers processes; a Ray task is one process
    workers = ctx.workers if config.executor == "local" else 1
    tasks = SplitTasks(stage, b.work_dir / "split", dataset_files(src.path),
                       partial(map_part, process_batch=process_batch, config=config,
                               batch_rows=batch_rows, workers=workers))
    b.start_work(len(tasks), "tasks")
    if ctx.rank is not None:
        run_rank_tasks(ctx, config, stage, tasks, tasks.pending(), work_dir=b.work_dir)
        return None
    with b:
        run_tasks_with(config, stage, tasks, tasks.pending(), work_dir=b.work_dir,
                       total=len(tasks))
        counts = tasks.assemble(b.dir)
        b.stats.update(counts.stats())
        if extra_stats:
            b.stats.update(extra_stats(b.dir))
        require_rows(stage, b.stats, config.allow_empty, source=str(src.path),
                     first_removed=counts.first_removed)
    data_stage_summary(b.name, b.stats, time.time() - b.started)
    return b


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


class FolderTasks:
    """Tasks 0 … len(self) - 1 that each build a folder `root/part-K/` (`build(k, tmp)`, into
    a temporary folder renamed into place) and seal it with `root/part-K.done`, which records
    every file's size and what `build` returned. A task is callable (`tasks(k)`), does nothing
    once sealed, and redoes a task whose files were lost or cut short; so an executor can run
    it anywhere that sees the workspace, as often as it likes."""
    root: Path

    def folder(self, k: int) -> Path:
        return part_path(self.root, k, "")

    def marker(self, k: int) -> Path:
        return part_path(self.root, k, ".done")

    def info(self, k: int) -> dict | None:
        return sealed(self.marker(k))

    def pending(self) -> list[int]:
        return [k for k in range(len(self)) if self.info(k) is None]

    def __call__(self, k: int) -> None:
        marker = self.marker(k)
        if sealed(marker) is not None:
            return
        marker.unlink(missing_ok=True)  # a damaged task's: redone now
        final = self.folder(k)
        tmp = fresh_dir(temporary_path(final))
        info = self.build(k, tmp)
        replace_dir(tmp, final)
        seal(marker, sorted(p for p in final.rglob("*") if p.is_file()), info)

    def build(self, k: int, tmp: Path) -> dict:
        raise NotImplementedError


@dataclass(frozen=True)
class SplitTasks(FolderTasks):
    """A row-filtering stage (or phase) as tasks, one per input part: task K calls
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
        if self.pending():
            raise UserError(f"{self.stage}: {len(self.pending())} of {len(self.parts)} tasks are "
                            f"not done in {self.root}; run them (every --rank) first")
        link_task_outputs([self.folder(k) for k in range(len(self.parts))], out_dir, self.stage)
        counts = self.counts()
        counts.check(self.stage)
        return counts


def tasks_of_rank(ctx, tasks: list[int]) -> list[int]:
    """The tasks this run owns: all, or with --rank R --world-size W those with t % W == R."""
    if ctx.rank is None:
        return list(tasks)
    return [t for t in tasks if t % ctx.world_size == ctx.rank]


def run_tasks_with(config, label: str, fn, tasks: list[int], *, work_dir: Path,
                   workers: int = 1, total: int | None = None) -> None:
    """`fn(t)` for each task on the config's executor (`executor`, `ray`); `total`: the
    tasks there are in all, to say how many an earlier run finished."""
    if total and len(tasks) < total:
        print(f"{label}: {total - len(tasks)} of {total} tasks already done (resumed)", flush=True)

    run_tasks(fn, tasks, label=label, executor=config.executor, ray=config.ray,
              workers=workers, work_dir=work_dir)


def run_rank_tasks(ctx, config, stage: str, fn, pending: list[int], *, work_dir: Path,
                   workers: int = 1, assemble: str | None = None) -> None:
    """The --rank run of a stage: this rank's pending tasks, then a line saying what is left."""
    mine = tasks_of_rank(ctx, pending)
    run_tasks_with(config, f"{stage} rank {ctx.rank}", fn, mine, work_dir=work_dir,
                   workers=workers)
    left = len(pending) - len(mine)
    print(f"{stage}: rank {ctx.rank}/{ctx.world_size} done ({len(mine)} tasks); {left} pending "
          f"for other ranks in {work_dir}; then run `{assemble or 'llmkit ' + stage}` without "
          "--rank to assemble the artifact")


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
