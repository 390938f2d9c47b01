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

from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from llmkit.data.clean import CleanConfig, clean_batch_counted, drop_boilerplate_lines
from llmkit.data.driver import Assembled, DataStage, Phase, SealedTasks, Work, run_data_stage
from llmkit.data.ingest import file_fingerprint
from llmkit.data.io import dataset_files, open_parquet
from llmkit.data.line_dedup import (count_line_keys, frequent_line_keys, load_frequent,
                                    save_counts, save_frequent)
from llmkit.data.normalize import normalize_text, scan_texts
from llmkit.data.pipeline import BATCH_ROWS, SplitTasks, SplitWriter, _mapper
from llmkit.core.workspace import Artifact
from llmkit.core.durable import kill_point

FREQUENT = "frequent_lines.npy"  # in the work area: the lines cut, from every part's counts


@dataclass(frozen=True)
class LineCountTasks(SealedTasks):
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
    src = ctx.input("raw")
    parts = dataset_files(src.path)
    blocklist = [Artifact(Path(cfg.url_blocklist), {"fingerprint": file_fingerprint(
        Path(cfg.url_blocklist))})] if cfg.url_blocklist else []
    phases = [Phase("line_counts", len(parts), lambda work: LineCountTasks(
        work.dir / "line_counts", parts, cfg), spread=True)] if cfg.line_dedup_min_docs else []
    phases.append(Phase("clean", len(parts), partial(cleaning, parts=parts, cfg=cfg)))
    return run_data_stage(ctx, DataStage("clean", cfg, [src, *blocklist], "clean", phases,
                                         partial(assemble, cfg=cfg), source=str(src.path)))


def cleaning(work: Work, *, parts: list, cfg: CleanConfig) -> CleanTasks:
    """The `clean` phase's tasks; with line dedup, the frequent lines are first found from
    every part's counts (once: the file stays in the work area)."""
    frequent = None
    if cfg.line_dedup_min_docs:
        frequent = work.dir / FREQUENT
        if not frequent.exists():
            save_frequent(frequent, frequent_line_keys(work.done["line_counts"].count_files(),
                                                       cfg.line_dedup_min_docs))
    return CleanTasks("clean", work.dir / "split", parts, partial(
        clean_part, config=cfg, frequent=str(frequent) if frequent else None,
        workers=work.within_task))


def assemble(out_dir: Path, done: dict, cfg: CleanConfig) -> Assembled:
    cleaning = done["clean"]
    counts = cleaning.assemble(out_dir)
    stats = counts.stats()
    edits = cleaning.edits()
    stats["pii_redacted"] = {k.removeprefix("pii_"): n for k, n in sorted(edits.items())
                             if k.startswith("pii_")}
    if cfg.line_dedup_min_docs:
        frequent = done["line_counts"].root.parent / FREQUENT
        stats["line_dedup"] = {"frequent_lines": len(load_frequent(frequent)),
                               "lines_cut": edits.get("line_dedup_lines", 0)}
    return Assembled(stats, counts.first_removed)
