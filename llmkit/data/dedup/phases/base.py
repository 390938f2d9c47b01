"""What every dedup phase is: a small class over the run's shared plan (`DedupPlan`)."""

from __future__ import annotations

from pathlib import Path

from llmkit.data.io import part_path


class Phase:
    """A phase of a dedup run: its `tasks()`, the `marker(task)` that says a task is done,
    the files a finished task leaves for the phases after it (`outputs(task)`), and
    `run(task) -> info` (what the marker records)."""

    name: str

    def __init__(self, plan):
        self.plan = plan


class ShardPhase(Phase):
    """A phase with one task per input shard S, which writes the folder `<phase>/part-S/`."""

    def tasks(self) -> list[int]:
        return list(range(len(self.plan.shards)))

    def folder(self, shard: int) -> Path:
        return part_path(self.plan.work / self.name, shard, "")

    def marker(self, shard: int) -> Path:
        return part_path(self.plan.work / self.name, shard, ".done")

    def outputs(self, shard: int) -> list[Path]:
        return sorted(p for p in self.folder(shard).rglob("*") if p.is_file())
