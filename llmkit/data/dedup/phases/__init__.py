"""The four phases of a dedup run: signatures -> buckets -> clusters -> filter, each a small
class of its own module (`Signatures`, `Buckets`, `Clusters`, `Filter`: its tasks, marker,
files and `run(task)`), and the plan they share (`DedupPlan`: input shards, work area, config).

Each phase is a folder in the artifact's work area (`Builder.work_dir`, kept across killed
runs) and is made of tasks; a task writes its files under a temporary name, renames them,
then writes its `.done` marker with their sizes (`workspace.seal`), so a rerun skips exactly
the finished tasks and redoes one whose files were lost or cut short since.

    signatures/part-00003/  keys.bin: per batch (blocks.npy: its rows) n_keys × rows keys;
                            values.bin + lengths.npy: verification payload
    buckets/key-007.npz     documents sharing a value of key row 7 (members, offsets)
    clusters/part-00003.parquet  (row, duplicate_of) of the rows to remove; stats.json
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
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from llmkit.data.dedup.phases.buckets import Buckets
from llmkit.data.dedup.phases.clusters import Clusters
from llmkit.data.dedup.phases.filter import Filter
from llmkit.data.dedup.phases.signatures import Signatures
from llmkit.data.dedup.sketch import Sketcher
from llmkit.data.io import dataset_files, part_path
from llmkit.data.pipeline import RowCounts, link_task_outputs
from llmkit.errors import UserError
from llmkit.workspace import kill_point, seal, sealed

PHASES = ("signatures", "buckets", "clusters", "filter")


class DedupPlan:
    """The tasks of one dedup run over `input_dir`, with state kept in `work_dir`."""

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
        return self.work / "buckets" / f"key-{key:03d}.npz"

    def removals_file(self, shard: int) -> Path:
        return part_path(self.work / "clusters", shard)

    @property
    def cluster_stats_file(self) -> Path:
        return self.work / "clusters" / "stats.json"

    # -- tasks and markers ---------------------------------------------------------------
    def tasks(self, phase: str) -> list[int]:
        return self.phases[phase].tasks()

    def done(self, phase: str, task: int) -> bool:
        return sealed(self.phases[phase].marker(task)) is not None

    def pending(self, phase: str) -> list[int]:
        return [t for t in self.tasks(phase) if not self.done(phase, t)]

    def _info(self, phase: str, task: int) -> dict:
        return json.loads(self.phases[phase].marker(task).read_text())

    def run(self, phase: str, task: int) -> None:
        """Run one task of a phase unless its marker says it is done."""
        if self.done(phase, task):
            return
        index = PHASES.index(phase)
        # each phase checked its own predecessor, so the one before is enough
        if index and self.pending(PHASES[index - 1]):
            p = PHASES[index - 1]
            raise UserError(f"dedup --phase {phase} needs phase {p} finished first "
                            f"({len(self.pending(p))} of its tasks are not done in "
                            f"{self.work / p}); run `llmkit dedup --phase {p}` for every "
                            "rank, then this one")
        unit = self.phases[phase]
        (self.work / phase).mkdir(parents=True, exist_ok=True)
        unit.marker(task).unlink(missing_ok=True)  # a damaged task's: redone now
        started = time.time()
        info = unit.run(task)
        kill_point(f"dedup:{phase}")  # the task's files written, not yet sealed
        _release_freed_memory()
        info["seconds"] = round(time.time() - started, 3)
        seal(unit.marker(task), unit.outputs(task), info)

    def shard_rows(self) -> np.ndarray:
        return np.array([self._info("signatures", s)["rows"] for s in range(len(self.shards))],
                        dtype=np.int64)

    # -- commit ---------------------------------------------------------------------------
    def assemble(self, out_dir: Path) -> dict:
        """Link every shard's filter output into `out_dir` (parts renumbered in shard order)
        and return the stage's stats. Needs every filter task done."""
        if self.pending("filter"):
            raise UserError(f"dedup: {len(self.pending('filter'))} filter tasks are not done; "
                            "run `llmkit dedup --phase filter` for every rank first")
        shards = range(len(self.shards))
        link_task_outputs([self.phases["filter"].folder(s) for s in shards], out_dir, "dedup")
        counts = sum((self._filter_counts(s) for s in shards), RowCounts())
        counts.check("dedup")
        clusters = json.loads(self.cluster_stats_file.read_text())
        return {**counts.stats(), "method": self.cfg.method, **self.method_stats(), **clusters,
                "seconds_by_phase": self.phase_seconds()}

    def _filter_counts(self, shard: int) -> RowCounts:
        info = self._info("filter", shard)
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
        return {p: round(sum(self._info(p, t).get("seconds", 0.0) for t in self.tasks(p)
                             if self.done(p, t)), 3) for p in PHASES}


def _release_freed_memory() -> None:
    """Give back to the system what the allocators keep of the memory a task freed (Arrow's
    pool and, on glibc, the C heap), so the next phase starts from the same size."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None)
        if hasattr(libc, "malloc_trim"):  # glibc, not musl
            libc.malloc_trim(0)
