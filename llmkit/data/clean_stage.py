"""The `llmkit clean` stage: its phases as sealed tasks, one per input part, and the assembly.

- `line_counts` (only with `line_dedup_min_docs`): each task cleans its part's texts as far as
  line dedup sees them (normalised, boilerplate lines dropped) and counts in how many
  documents each line occurs; the driver sums the parts' counts into the set of frequent
  lines (`frequent_lines.npy` in the work area);
- `clean`: each task cleans its part (`clean_batch_counted`) with that set, over --workers
  processes, and writes its kept and removed rows; its marker also holds what it edited.

A rerun skips sealed tasks. With --rank, a rank runs its share of the counting, and once every
part is counted its share of the cleaning; a plain run then assembles. The block list file,
when given, is an input of the artifact: a changed list makes it stale.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from llmkit.data.clean import CleanConfig, clean_batch_counted, drop_boilerplate_lines
from llmkit.data.io import dataset_files, open_parquet
from llmkit.data.line_dedup import (count_line_keys, frequent_line_keys, load_frequent,
                                    save_counts, save_frequent)
from llmkit.data.normalize import normalize_text, scan_texts
from llmkit.data.pipeline import (BATCH_ROWS, FolderTasks, SplitTasks, SplitWriter, _mapper,
                                  require_rows, run_rank_tasks, run_tasks_with)
from llmkit.progress import data_stage_summary
from llmkit.workspace import kill_point


@dataclass(frozen=True)
class LineCountTasks(FolderTasks):
    """Task K counts the lines of part K into `root/part-K/counts.npz`."""
    root: Path
    parts: list
    cfg: CleanConfig

    def __len__(self) -> int:
        return len(self.parts)

    def build(self, k: int, tmp: Path) -> dict:
        texts = []
        for batch in open_parquet(self.parts[k]).iter_batches(batch_size=BATCH_ROWS,
                                                             columns=["text"]):
            raw = [t or "" for t in batch.column("text").to_pylist()]
            texts += [drop_boilerplate_lines(normalize_text(t, self.cfg, found), self.cfg)[0]
                      for t, found in zip(raw, scan_texts(raw, self.cfg))]
        keys, counts = count_line_keys(texts)
        save_counts(tmp / "counts.npz", keys, counts)
        return {"documents": len(texts), "distinct_lines": len(keys)}

    def count_files(self) -> list[Path]:
        return [self.folder(k) / "counts.npz" for k in range(len(self))]


@dataclass(frozen=True)
class CleanTasks(SplitTasks):
    """`SplitTasks` whose split also returns what it edited; the marker keeps it (`edits`)."""

    def build(self, k: int, tmp: Path) -> dict:
        writer = SplitWriter.task_layout(tmp)
        rows, edits = self.split(k, self.parts[k], writer)
        return {**writer.close(rows, self.stage).as_json(), "edits": dict(edits)}

    def edits(self) -> Counter:
        total: Counter = Counter()
        for k in range(len(self)):
            total.update(self.info(k)["edits"])
        return total


def clean_part(task: int, part: Path, writer: SplitWriter, *, config: CleanConfig,
               frequent: str | None, workers: int) -> tuple[int, Counter]:
    """Clean one part batch by batch on `workers` processes (results in input order):
    (rows read, what was edited)."""
    rows, edits = 0, Counter()
    fn = partial(_clean_batch, config=config, frequent=frequent)
    with _mapper(workers) as pmap:
        for kept, removed, edited in pmap(fn, open_parquet(part).iter_batches(
                batch_size=BATCH_ROWS, use_threads=False)):
            writer.write(kept, removed)
            edits.update(edited)
            rows += kept.num_rows + removed.num_rows
            kill_point("map:batch")
    return rows, edits


def _clean_batch(batch, config: CleanConfig, frequent: str | None):
    return clean_batch_counted(batch, config, load_frequent(frequent) if frequent else frozenset())


def run_clean(ctx, cfg: CleanConfig):
    """Run (or resume) `llmkit clean`; the Builder, or None for a --rank run."""
    from llmkit.data.ingest import file_fingerprint
    from llmkit.workspace import Artifact

    src = ctx.input("raw")
    inputs = [src]
    if cfg.url_blocklist:
        blocklist = Path(cfg.url_blocklist)
        inputs.append(Artifact(blocklist, {"fingerprint": file_fingerprint(blocklist)}))
    b = ctx.workspace.builder(ctx.out_name("clean"), stage="clean", config=cfg, inputs=inputs,
                              force=ctx.force)
    if b.up_to_date:
        return b
    parts = dataset_files(src.path)
    counting = LineCountTasks(b.work_dir / "line_counts", parts, cfg)
    frequent = b.work_dir / "frequent_lines.npy"
    workers = ctx.workers if cfg.executor == "local" else 1
    cleaning = CleanTasks("clean", b.work_dir / "split", parts, partial(
        clean_part, config=cfg, frequent=str(frequent) if cfg.line_dedup_min_docs else None,
        workers=workers))
    b.start_work(len(cleaning) * (2 if cfg.line_dedup_min_docs else 1), "tasks")
    if ctx.rank is not None:
        if cfg.line_dedup_min_docs and not _count_lines(ctx, cfg, counting, frequent, b):
            return None
        run_rank_tasks(ctx, cfg, "clean", cleaning, cleaning.pending(), work_dir=b.work_dir)
        return None
    with b:
        if cfg.line_dedup_min_docs:
            _count_lines(ctx, cfg, counting, frequent, b)
        run_tasks_with(cfg, "clean", cleaning, cleaning.pending(), work_dir=b.work_dir,
                       total=len(cleaning))
        counts = cleaning.assemble(b.dir)
        b.stats.update(counts.stats())
        edits = cleaning.edits()
        b.stats["pii_redacted"] = {k.removeprefix("pii_"): n for k, n in sorted(edits.items())
                                   if k.startswith("pii_")}
        if cfg.line_dedup_min_docs:
            b.stats["line_dedup"] = {"frequent_lines": len(load_frequent(frequent)),
                                     "lines_cut": edits.get("line_dedup_lines", 0)}
        require_rows("clean", b.stats, cfg.allow_empty, source=str(src.path),
                     first_removed=counts.first_removed)
    data_stage_summary(b.name, b.stats, time.time() - b.started)
    return b


def _count_lines(ctx, cfg: CleanConfig, counting: LineCountTasks, frequent: Path, b) -> bool:
    """The `line_counts` phase (this rank's share with --rank), then the frequent lines once
    every part is counted; False while other ranks still have parts to count."""
    if ctx.rank is not None:
        run_rank_tasks(ctx, cfg, "clean line_counts", counting, counting.pending(),
                       work_dir=b.work_dir, assemble="llmkit clean (same input and settings)")
    else:
        run_tasks_with(cfg, "clean line_counts", counting, counting.pending(),
                       work_dir=b.work_dir, workers=ctx.workers, total=len(counting))
    if counting.pending():
        return False
    if not frequent.exists():
        save_frequent(frequent, frequent_line_keys(counting.count_files(),
                                                   cfg.line_dedup_min_docs))
    return True
