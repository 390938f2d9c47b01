"""What the score-then-filter stages (ppl-filter, quality) share: score every row, then filter
with every score known.

A stage names its `Scoring` (the scorer, loaded once per process, and what it makes of a batch
of texts) and its decision (every row's scores and groups -> a removal reason code) in a
`ScoreFilter`, whose `phases` are the stage's two phases:
1. score, a task per input part (`ScoreTasks`): `root/part-K/scores.npz` holds each row's score
   and its group's index into the part's own list of `group_by` values. Each batch's scores
   are kept as they are done (`root/part-K.batches/`), so a killed task resumes at its first
   unscored batch.
2. filter, a task per input part (`SplitTasks`): a decision may need every score (percentiles,
   a top share), so it is made once, over the whole dataset in input order, before the tasks;
   each task writes its part's rows with the score column, removed ones with their reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from llmkit.data.driver import Phase, SealedTasks, Work
from llmkit.data.io import open_parquet
from llmkit.data.pipeline import SplitTasks
from llmkit.errors import UserError
from llmkit.core.durable import kill_point


class Scoring(Protocol):
    """A stage's scorer, picklable (a task may run in another process)."""

    def key(self) -> object:
        """What tells one scorer from another (a process keeps the last one it opened)."""

    def open(self) -> object:
        """The scorer (a model, a classifier), loaded in the process that scores."""

    def score(self, texts: list, scorer: Callable[[], object]) -> np.ndarray:
        """The scores of a batch's texts; `scorer()` opens the scorer on first use."""


@dataclass(frozen=True)
class ScoreFilter:
    """A score-then-filter stage: its score `column` (also the name of its files), its
    `reasons` (index 0 is None: kept) and `decide(scores, groups) -> int8 codes into reasons`
    over the whole dataset."""
    stage: str                   # the command, in messages
    column: str                  # `ppl`, `quality`: the column the rows get
    reasons: tuple
    scoring: Scoring
    decide: Callable[[np.ndarray, np.ndarray], np.ndarray]
    group_by: str | None         # the column whose values group the rows (None: one group)
    batch_rows: int

    def phases(self, parts: list) -> list[Phase]:
        return [Phase("score", len(parts), lambda work: ScoreTasks(work.dir / "score", parts, self),
                      spread=True),
                Phase("filter", len(parts), lambda work: self.filter_tasks(work, parts))]

    def filter_tasks(self, work: Work, parts: list) -> SplitTasks:
        """The filter's tasks, given every row's score and the decision made from all of them."""
        scores = work.done["score"]
        values, codes, _ = scores.collect()
        bounds = np.cumsum([0, *(scores.rows(k) for k in range(len(parts)))])
        return SplitTasks(self.stage, work.dir / "filter", parts,
                          PartFilter(self, values, self.decide(values, codes), bounds))


_SCORERS: dict = {}


@dataclass(frozen=True)
class ScoreTasks(SealedTasks):
    """Task K scores input part K (see the module's docstring)."""
    root: Path
    parts: list
    spec: ScoreFilter

    def __len__(self) -> int:
        return len(self.parts)

    def scores_file(self, k: int) -> Path:
        return self.folder(k) / "scores.npz"

    def build(self, k: int, tmp: Path) -> dict:
        scratch = self.root / f"part-{k:05d}.batches"
        scratch.mkdir(parents=True, exist_ok=True)
        scores, codes, groups = self.score_part(self.parts[k], scratch)
        np.savez(tmp / "scores.npz", **{self.spec.column: scores}, codes=codes,
                 groups=np.array(groups, dtype=object))
        return {"rows": len(scores)}

    def rows(self, k: int) -> int:
        return self.info(k)["rows"]

    def scorer(self):
        """The scorer, loaded once per process."""
        key = (self.spec.stage, self.spec.scoring.key())
        if key not in _SCORERS:
            _SCORERS.clear()
            _SCORERS[key] = self.spec.scoring.open()
        return _SCORERS[key]

    def score_part(self, part: Path, scratch: Path) -> tuple[np.ndarray, np.ndarray, list]:
        """The score of every row of one parquet part, each row's group (an index into the
        returned `group_by` values; all 0 without group_by) and those values. The scorer is
        asked for only when a batch is not scored yet in `scratch`."""
        spec = self.spec
        columns = ["text"] + ([spec.group_by] if spec.group_by else [])
        pf = open_parquet(part)
        if spec.group_by and spec.group_by not in pf.schema_arrow.names:
            raise UserError(f"group_by={spec.group_by!r}: {part} has no such column "
                            f"(it has {', '.join(pf.schema_arrow.names)})")
        names: dict = {}
        scores, codes = [np.zeros(0)], [np.zeros(0, np.int64)]
        for k, batch in enumerate(pf.iter_batches(columns=columns, batch_size=spec.batch_rows,
                                                  use_threads=False)):
            done = scratch / f"{spec.column}-{k:06d}.npy"
            if done.is_file():
                values = np.load(done)
            else:
                values = spec.scoring.score(batch.column("text").to_pylist(), self.scorer)
                np.save(done.with_suffix(".tmp.npy"), values)
                done.with_suffix(".tmp.npy").replace(done)
                kill_point(f"{spec.column}:batch")
            scores.append(values)
            groups = (batch.column(spec.group_by).to_pylist() if spec.group_by
                      else [None] * batch.num_rows)
            codes.append(np.array([names.setdefault(v, len(names)) for v in groups], np.int64))
        return np.concatenate(scores), np.concatenate(codes), list(names)

    def collect(self) -> tuple[np.ndarray, np.ndarray, list]:
        """Every row's score in input order, its group (an index into the returned `group_by`
        values, in order of first appearance) and those values: what one pass over the whole
        dataset would give."""
        names: dict = {}
        scores, codes = [np.zeros(0)], [np.zeros(0, np.int64)]
        for k in range(len(self.parts)):
            with np.load(self.scores_file(k), allow_pickle=True) as f:
                scores.append(f[self.spec.column])
                to_global = np.array([names.setdefault(v, len(names)) for v in f["groups"]],
                                     np.int64)
                codes.append(to_global[f["codes"]] if len(f["codes"]) else f["codes"])
        return np.concatenate(scores), np.concatenate(codes).astype(np.int64), list(names)


@dataclass(frozen=True)
class PartFilter:
    """A `SplitTasks` split: part `task`'s rows with their score, removed as `reasons` says
    (both the whole dataset's, in input order; part k is rows [bounds[k], bounds[k+1]))."""
    spec: ScoreFilter
    scores: np.ndarray
    reasons: np.ndarray
    bounds: np.ndarray

    def __call__(self, task: int, part: Path, writer) -> int:
        start = first = int(self.bounds[task])
        for batch in open_parquet(part).iter_batches(batch_size=self.spec.batch_rows,
                                                     use_threads=False):
            end = start + batch.num_rows
            writer.write(*split_batch(batch, self.spec.column, self.scores[start:end],
                                      self.reasons[start:end], self.spec.reasons))
            start = end
        if start != self.bounds[task + 1]:  # a bug, never a user error
            raise AssertionError(f"{self.spec.stage}: part {part} has {start - first} rows, "
                                 f"{self.bounds[task + 1] - first} were scored")
        return start - first


def split_batch(batch, column: str, scores: np.ndarray, codes: np.ndarray, reasons: tuple):
    """(kept table, removed table with `reason`), both with the score `column` (`codes`: each
    row's index into `reasons`, 0 = kept)."""
    import pyarrow as pa

    table = pa.Table.from_batches([batch])
    if column in table.column_names:  # scored before: the old scores are replaced
        table = table.drop_columns([column])
    table = table.append_column(column, pa.array(scores, pa.float64()))
    removed = codes > 0
    gone = table.filter(pa.array(removed))
    gone = gone.append_column("reason", pa.array([reasons[r] for r in codes[removed]], pa.string()))
    return table.filter(pa.array(~removed)), gone


def scored_median_mean(scores: np.ndarray) -> dict:
    """The median and mean of the scored (non-NaN) rows, for the manifest."""
    scored = scores[~np.isnan(scores)]
    return {"median": float(np.median(scored)) if len(scored) else None,
            "mean": float(np.mean(scored)) if len(scored) else None}
