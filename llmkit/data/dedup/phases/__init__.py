"""The four phases of a dedup run: signatures -> buckets -> clusters -> filter, each a small
class of its own module (`Signatures`, `Buckets`, `Clusters`, `Filter`: sealed tasks of
llmkit.data.driver, each with its `run(task)`), and the plan they share (`DedupPlan`: input
shards, work area, config).

Each phase is a folder in the artifact's work area (`Builder.work_dir`, kept across killed
runs) and is made of tasks; the driver seals each task's folder `<phase>/part-K/` once it is
in place (`<phase>/part-K.done`, with its files' sizes), so a rerun skips exactly the
finished tasks and redoes one whose files were lost or cut short since.

    signatures/part-00003/  keys.bin: per batch (blocks.npy: its rows) n_keys × rows keys;
                            values.bin + lengths.npy: verification payload
    buckets/part-00007/     bucket.npz: documents sharing a value of key row 7 (members, offsets)
    clusters/part-00000/    part-00003.parquet: (row, duplicate_of) of the rows of shard 3 to
                            remove; stats.json
    filter/part-00003/      kept/ and removed/ parquet parts of input shard 3

Tasks: one per input shard (parquet part file) for signatures and filter, one per key row
(MinHash band, SimHash table) for buckets, one in all for clusters. Task t of a phase runs on
`rank = t % world_size`. A document is addressed by its global index: its shard's first
index plus its row in the shard (shards in file order), which is also "input order": each
cluster keeps its smallest index.

Memory: signatures and filter hold one batch of text at a time and stream what they make to
disk; a bucket task holds one key per document (8 bytes × documents, sorted); clusters holds
a few int64 per document and copies the payload of the documents that share a bucket into
one file, which it maps and reads a few MB at a time. No phase holds the corpus text, its
signatures or its payload.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np

from llmkit.data.dedup.phases.buckets import BUCKET_FILE, Buckets
from llmkit.data.dedup.phases.clusters import STATS_FILE, Clusters
from llmkit.data.dedup.phases.filter import Filter
from llmkit.data.dedup.phases.signatures import Signatures
from llmkit.data.dedup.sketch import Sketcher
from llmkit.data.driver import Assembled, Phase, Work
from llmkit.data.io import dataset_files, part_path
from llmkit.data.pipeline import RowCounts, link_task_outputs

PHASES = ("signatures", "buckets", "clusters", "filter")


class DedupPlan:
    """The phases of one dedup run over `input_dir`, with state kept in `work_dir`."""

    def __init__(self, input_dir: Path, work_dir: Path, cfg):
        self.input_dir = Path(input_dir)
        self.work = Path(work_dir)
        self.cfg = cfg
        self.shards = dataset_files(self.input_dir)
        self.sketcher = Sketcher(cfg)
        self.reason = f"{cfg.method}_duplicate"
        self.phases = {unit.name: unit(self) for unit in (Signatures, Buckets, Clusters, Filter)}

    # -- files that more than one phase reads -------------------------------------------
    def bucket_file(self, key: int) -> Path:
        return self.phases["buckets"].folder(key) / BUCKET_FILE

    def removals_file(self, shard: int) -> Path:
        return part_path(self.phases["clusters"].folder(0), shard)

    @property
    def cluster_stats_file(self) -> Path:
        return self.phases["clusters"].folder(0) / STATS_FILE

    def shard_rows(self) -> np.ndarray:
        signatures = self.phases["signatures"]
        return np.array([signatures.info(s)["rows"] for s in range(len(self.shards))],
                        dtype=np.int64)

    # -- commit ---------------------------------------------------------------------------
    def assemble(self, out_dir: Path) -> Assembled:
        """Link every shard's filter output into `out_dir` (parts renumbered in shard order);
        the stage's stats. Needs every task done."""
        shards = range(len(self.shards))
        link_task_outputs([self.phases["filter"].folder(s) for s in shards], out_dir, "dedup")
        counts = sum((self._filter_counts(s) for s in shards), RowCounts())
        counts.check("dedup")
        clusters = json.loads(self.cluster_stats_file.read_text())
        return Assembled({**counts.stats(), "method": self.cfg.method, **self.method_stats(),
                          **clusters, "seconds_by_phase": self.phase_seconds()})

    def _filter_counts(self, shard: int) -> RowCounts:
        info = self.phases["filter"].info(shard)
        return RowCounts(info["rows_in"], info["rows_out"], info["rows_removed"],
                         Counter({self.reason: info["rows_removed"]}))

    def method_stats(self) -> dict:
        if self.cfg.method == "minhash":
            return {"lsh_bands": self.sketcher.bands, "lsh_rows": self.sketcher.rows}
        if self.cfg.method == "simhash":
            return {"simhash_tables": self.sketcher.n_keys}
        return {}

    def phase_seconds(self) -> dict:
        """Task seconds summed per phase (the work done, whichever machines did it)."""
        return {p: round(sum(unit.info(t).get("seconds", 0.0) for t in range(len(unit))), 3)
                for p, unit in self.phases.items()}


def dedup_phases(input_dir: Path, cfg) -> list[Phase]:
    """The four phases as llmkit.data.driver runs them, their tasks spread over --workers."""
    sizes = (len(dataset_files(input_dir)), Sketcher(cfg).n_keys, 1, len(dataset_files(input_dir)))
    return [Phase(name, size, partial(_phase_of, name=name, input_dir=input_dir, cfg=cfg),
                  spread=True) for name, size in zip(PHASES, sizes)]


def _phase_of(work: Work, *, name: str, input_dir: Path, cfg):
    """Phase `name` of the run's plan (made by the first phase, shared by the others)."""
    first = work.done.get(PHASES[0])
    return (first.plan if first else DedupPlan(input_dir, work.dir, cfg)).phases[name]
