"""What every dedup phase is: sealed tasks (llmkit.data.driver) over the run's shared plan
(`DedupPlan`)."""

from __future__ import annotations

import sys
from pathlib import Path

from llmkit.data.driver import SealedTasks
from llmkit.core.durable import kill_point


class DedupPhase(SealedTasks):
    """A phase of a dedup run: `len(phase)` tasks, task k building the folder `<phase>/part-k/`:
    `run(task)` writes the task's files into `self.temporary(task)` (fresh, the driver seals it
    once renamed into place) and returns what the marker records."""

    name: str

    def __init__(self, plan):
        self.plan = plan
        self.root = Path(plan.work) / self.name

    def build(self, k: int, tmp: Path) -> dict:
        info = self.run(k)
        kill_point(f"dedup:{self.name}")  # the task's files written, not yet sealed
        _release_freed_memory()
        return info


class ShardPhase(DedupPhase):
    """A phase with one task per input shard S, which writes the folder `<phase>/part-S/`."""

    def __len__(self) -> int:
        return len(self.plan.shards)


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
