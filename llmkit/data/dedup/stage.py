"""`llmkit dedup`: remove exact or near duplicates, keeping the first document of each cluster.

Runs the four phases of `llmkit.data.dedup.phases` (signatures -> buckets -> clusters -> filter).

* Locally (no `--rank`): every phase runs here, its tasks spread over `--workers` processes;
  then the filter outputs are assembled into the artifact. `--phase P` stops after phase P
  (only a run that reaches filter writes the artifact).
* Across machines: `--phase P --rank R --world-size W` runs the tasks of phase P that fall
  to rank R (a Slurm array, one phase after the other) and writes nothing but its tasks'
  files in the shared work area. When every rank has run every phase, one plain
  `llmkit dedup` (same config and input, no --rank) finds all tasks done and only
  assembles and commits the artifact. Any task left undone, it runs itself.

A rerun skips finished tasks (their `.done` markers); the work area is named after the
stage fingerprint (config + input), so it is only reused for the same run (`--force` too
reuses finished tasks: they are the same computation), and it is deleted once the artifact
is committed.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

from llmkit.data.dedup.exact import ExactConfig
from llmkit.data.dedup.minhash import MinHashConfig
from llmkit.data.dedup.phases import PHASES, DedupPlan
from llmkit.data.dedup.simhash import SimHashConfig
from llmkit.errors import ConfigError, UserError
from llmkit.executor import RayConfig, executor_field, ray_field


@dataclass
class DedupConfig:
    method: Literal["exact", "simhash", "minhash"] = "minhash"  # what counts as a duplicate
    exact: ExactConfig = field(default_factory=ExactConfig)        # method=exact
    simhash: SimHashConfig = field(default_factory=SimHashConfig)  # method=simhash
    minhash: MinHashConfig = field(default_factory=MinHashConfig)  # method=minhash
    batch_rows: int = 512   # documents per batch (memory ∝ batch_rows × document size)
    allow_empty: bool = False  # write an empty output instead of refusing it (exit 2)
    executor: Literal["local", "ray"] = executor_field()  # where tasks run (not fingerprinted)
    ray: RayConfig = ray_field()  # executor=ray: the cluster, what a task reserves

    def __post_init__(self):
        if self.batch_rows < 1:
            raise ConfigError(f"dedup.batch_rows must be ≥ 1, got {self.batch_rows}")


def run_dedup(ctx, cfg: DedupConfig, phase: str | None = None):
    """Run (or resume) the dedup stage; returns the Builder, or None for a partial run."""
    from llmkit.data.pipeline import require_rows, tasks_of_rank

    _arrow_allocator_that_returns_memory()
    if phase is not None and phase not in PHASES:
        raise UserError(f"--phase must be one of {', '.join(PHASES)}, got {phase!r}")
    if ctx.rank is not None and phase is None:
        raise UserError("--rank runs one task of one phase: add --phase "
                        f"({' | '.join(PHASES)}), one phase after the other")
    src = ctx.input("clean")
    b = ctx.workspace.builder(ctx.out_name("dedup"), stage="dedup", config=cfg, inputs=[src],
                              force=ctx.force)
    if b.up_to_date:
        return b
    plan = DedupPlan(src.path, b.work_dir, cfg)
    b.start_work(sum(len(plan.tasks(p)) for p in PHASES), "tasks")
    if ctx.rank is not None:
        tasks = tasks_of_rank(ctx, plan.tasks(phase))
        run_tasks(plan, phase, tasks, ctx, cfg)
        print(f"dedup {phase}: rank {ctx.rank}/{ctx.world_size} done ({len(tasks)} tasks); "
              f"{len(plan.pending(phase))} of {len(plan.tasks(phase))} still pending")
        return None
    last = PHASES.index(phase) if phase else len(PHASES) - 1
    if last < len(PHASES) - 1:
        for p in PHASES[:last + 1]:
            run_tasks(plan, p, plan.pending(p), ctx, cfg)
        print(f"dedup: phases up to {phase} done in {plan.work}")
        return None
    with b:
        for p in PHASES:
            run_tasks(plan, p, plan.pending(p), ctx, cfg)
        b.stats.update(plan.assemble(b.dir))
        require_rows("dedup", b.stats, cfg.allow_empty, source=src.name)
    _summary(b)
    return b


def _arrow_allocator_that_returns_memory() -> None:
    """Every phase streams a batch at a time, but Arrow's default allocator (mimalloc) keeps
    what the parquet reader and writer free: the process grew by 40 MB more over a phase (on
    a 100 MB corpus, peak memory 1.4× the text instead of 1.2×). The system allocator gives it
    back. Arrow reads the choice once, when it loads, so this only acts where pyarrow is not
    imported yet (the `llmkit dedup` process, and the worker processes it starts)."""
    if "pyarrow" not in sys.modules:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


@dataclass(frozen=True)
class PhaseTask:
    """Task t of one phase of a plan, as an executor runs it: `PhaseTask(plan, phase)(t)`."""
    plan: DedupPlan
    phase: str

    def __call__(self, task: int) -> None:
        self.plan.run(self.phase, task)


def run_tasks(plan: DedupPlan, phase: str, tasks: list[int], ctx, cfg: DedupConfig) -> None:
    """Tasks of one phase on the config's executor (locally on --workers processes)."""
    from llmkit.data.pipeline import run_tasks_with

    total = len(plan.tasks(phase)) if ctx.rank is None else None  # a rank has a share only
    run_tasks_with(cfg, f"dedup {phase}", PhaseTask(plan, phase), tasks, work_dir=plan.work,
                   workers=ctx.workers, total=total)


def _summary(b) -> None:
    from llmkit.progress import data_stage_summary, print_summary

    s = b.stats
    data_stage_summary(b.name, s, time.time() - b.started)
    print_summary("clusters", [("clusters", s["clusters"]), ("largest", s["largest_cluster"]),
                               ("pairs verified", s["candidate_pairs_verified"]),
                               ("pairs accepted", s["candidate_pairs_accepted"])])
