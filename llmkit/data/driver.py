"""The one driver of every data stage (the data wing's `fit_stage`); the one way a task is sealed.

A data stage names its inputs, its phases and its assembly (`DataStage`); `run_data_stage` does
the rest: the up-to-date check, the work area, each phase's pending tasks on the config's
executor (`run`: llmkit.core.executor.RunsOn), this rank's share only with --rank, the assembly
into the artifact, the refusal of an output without rows (`require_rows`) and the summary.

A phase is a set of sealed tasks (`SealedTasks`, datatrove's completion markers): task k fills
a fresh temporary folder (`build(k, tmp)`), which `run_task` — nothing else in the package —
renames into `root/part-K/` and seals with `root/part-K.done`, recording what `build` returned
and every file's size. So a task runs anywhere that sees the workspace, as often as it likes, a rerun
skips it once sealed and redoes it when its files were lost or cut short, and the phases after
it start only once every task of it is sealed. The artifact is the same for any executor,
--workers count or --rank/--world-size split.

    def run_clean(ctx, cfg):
        src = ctx.input("raw")
        return run_data_stage(ctx, DataStage(
            "clean", cfg, inputs=[src], out="clean", source=str(src.path),
            phases=[Phase("clean", len(parts), lambda work: CleanTasks(...))],
            assemble=lambda out, done: Assembled(...)))
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from llmkit.data.io import fresh_dir, replace_dir
from llmkit.errors import UserError
from llmkit.core.executor import RunsOn, run_option
from llmkit.core.progress import data_stage_summary
from llmkit.core.durable import kill_point, seal, sealed


@dataclass
class DataConfig:
    """What every data stage's config has, declared once: the refusal of an empty output and
    where the stage runs (its `run` section, not in the fingerprint)."""
    allow_empty: bool = False  # write an output without rows instead of refusing it (exit 2)
    run: RunsOn = run_option()  # where tasks run: executor, workers, rank/world_size, ray (not fingerprinted)


class SealedTasks:
    """Tasks 0 … len(self) - 1 of a phase. Task k builds the folder `root/<task_name(k)>/`:
    `build(k, tmp)` writes its files into the fresh folder `tmp` and returns what its marker
    records.
    Callable (`tasks(k)`, what an executor runs): `run_task` does the rest."""
    root: Path

    def __len__(self) -> int:
        raise NotImplementedError

    def build(self, k: int, tmp: Path) -> dict:
        raise NotImplementedError

    def task_name(self, k: int) -> str:
        return f"part-{k:05d}"

    def accepts(self, k: int, info: dict) -> bool:
        """A stage's own check of a sealed task's record against its files (beyond sizes)."""
        return True

    def folder(self, k: int) -> Path:
        return Path(self.root) / self.task_name(k)

    def marker(self, k: int) -> Path:
        return Path(self.root) / f"{self.task_name(k)}.done"

    def temporary(self, k: int) -> Path:
        """Where this process builds task k: a folder of the task's own name (what a build may
        name files after) in a folder of this process (two runs that wrongly share a task
        never write into one file)."""
        return Path(self.root) / f".tmp-{os.getpid()}" / self.task_name(k)

    def info(self, k: int) -> dict | None:
        """What task k's marker records, if the task is sealed and its files intact; else None."""
        info = sealed(self.marker(k))
        return info if info is not None and self.accepts(k, info) else None

    def pending(self) -> list[int]:
        return [k for k in range(len(self)) if self.info(k) is None]

    def __call__(self, k: int) -> None:
        run_task(self, k)


def run_task(tasks: SealedTasks, k: int) -> None:
    """Run task k unless it is sealed: build it in a temporary folder, rename that into place,
    then seal it — the only place a task's completion marker is written."""
    if tasks.info(k) is not None:
        return
    marker, final = tasks.marker(k), tasks.folder(k)
    marker.unlink(missing_ok=True)  # a damaged task's: redone now
    tmp = fresh_dir(tasks.temporary(k))
    started = time.time()
    info = tasks.build(k, tmp)
    try:
        replace_dir(tmp, final)
    except OSError as e:
        raise UserError(f"cannot replace the damaged task folder {final} ({e}); delete "
                        f"{final.parent} and rerun") from None
    with contextlib.suppress(OSError):  # another task of this process may be building there
        tmp.parent.rmdir()
    kill_point("task:built")  # the task's files in place, not yet sealed
    seal(marker, sorted(p for p in final.rglob("*") if p.is_file()),
         {**info, "seconds": round(time.time() - started, 3)})


@dataclass
class Work:
    """What a phase's tasks are made from: the stage's work area, the processes (or threads)
    one task may use, and the tasks of the phases before it (all sealed), by name."""
    dir: Path
    within_task: int
    done: dict


@dataclass(frozen=True)
class Phase:
    """A phase of a data stage: `size` tasks, made by `tasks(work)` once the phases before it
    are done. `spread`: --workers run its tasks side by side (else a task at a time, each task
    using them: `Work.within_task`)."""
    name: str
    size: int
    tasks: Callable[[Work], SealedTasks]
    spread: bool = False


@dataclass
class Assembled:
    """What an assembly gives the driver: the manifest's stats, and for the refusal of an
    empty output the first row removed and words for reason codes."""
    stats: dict
    first_removed: str | None = None
    explain: dict | None = None


@dataclass
class DataStage:
    """A data stage as the driver runs it."""
    name: str                    # the command (`clean`): the manifest's stage, messages
    config: DataConfig
    inputs: list                 # the artifacts it reads (fingerprinted, recorded)
    out: str                     # the artifact a run writes without --out
    phases: list[Phase]
    assemble: Callable[[Path, dict], Assembled]  # (artifact folder, phases' tasks by name)
    source: str                  # the input, as the refusal of an empty output names it
    unit: str = "rows"           # what the input is made of, in that refusal
    refuse_empty: Callable[[dict], None] | None = None  # instead of `require_rows` (stats)
    summary: Callable | None = None  # (builder) -> None, instead of `data_stage_summary`
    notes: list = field(default_factory=list)  # more summary lines
    work_unit: str = "tasks"     # what `llmkit status` counts in the work area


def run_data_stage(ctx, stage: DataStage, phase: str | None = None):
    """Run (or resume) a data stage; its Builder once the artifact is committed (or up to
    date). A run with `run.rank` does this rank's share of each phase as far as the phases before
    it are done, and commits nothing; `phase`: with a rank, only that phase (the ones before it
    must be done), without, every phase up to it, then stop. Those runs return None."""
    runs, names = stage.config.run, [p.name for p in stage.phases]
    if phase is not None and phase not in names:
        raise UserError(f"--phase must be one of {', '.join(names)}, got {phase!r}")
    b = ctx.workspace.builder(ctx.out_name(stage.out), stage=stage.name, config=stage.config,
                              inputs=stage.inputs, force=ctx.force)
    if b.up_to_date:
        return b
    b.start_work(sum(p.size for p in stage.phases), stage.work_unit)
    last = names.index(phase) if phase else len(names) - 1
    if runs.rank is not None or last < len(names) - 1:
        only = phase if runs.rank is not None else None
        _run_phases(stage, b.work_dir, stage.phases[:last + 1], only=only)
        return None
    with b:
        done = _run_phases(stage, b.work_dir, stage.phases)
        got = stage.assemble(b.dir, done)
        b.stats.update(got.stats)
        if stage.refuse_empty:
            stage.refuse_empty(b.stats)
        else:
            require_rows(stage.name, b.stats, stage.config.allow_empty, source=stage.source,
                         first_removed=got.first_removed, explain=got.explain, unit=stage.unit)
    if stage.summary:
        stage.summary(b)
    else:
        data_stage_summary(b.name, b.stats, time.time() - b.started, notes=stage.notes)
    return b


def _run_phases(stage: DataStage, work: Path, phases: list[Phase], only: str | None = None
                ) -> dict:
    """Each phase's pending tasks (this rank's share with a rank), in order; a rank stops at a
    phase that other ranks' tasks still hold. Returns the phases' tasks by name."""
    runs, done = stage.config.run, {}
    for i, phase in enumerate(phases):
        if i and (left := done[phases[i - 1].name].pending()):
            if only:
                before = phases[i - 1].name
                raise UserError(
                    f"{stage.name} --phase {phase.name} needs phase {before} finished first "
                    f"({len(left)} of its tasks are not done in {work / before}); run `llmkit "
                    f"{stage.name} --phase {before}` for every rank, then this one")
            break  # a rank run: the other ranks' share of the phase before is still to do
        tasks = done[phase.name] = phase.tasks(Work(work, runs.within_task(), done))
        if only and phase.name != only:
            continue
        label = stage.name if len(stage.phases) == 1 else f"{stage.name} {phase.name}"
        pending = tasks.pending()
        mine = runs.share(pending)
        if runs.rank is None and len(pending) < len(tasks):
            print(f"{label}: {len(tasks) - len(pending)} of {len(tasks)} tasks already done "
                  "(resumed)", flush=True)
        runs.run(tasks, mine, label=label, work_dir=work, spread=phase.spread)
        if runs.rank is None and (left := tasks.pending()):  # lost or damaged meanwhile
            raise UserError(f"{stage.name}: {len(left)} tasks of phase {phase.name} are not "
                            f"done in {work}; rerun `llmkit {stage.name}`")
        if runs.rank is not None:
            print(f"{label}: rank {runs.rank}/{runs.world_size} done ({len(mine)} tasks); "
                  f"{len(pending) - len(mine)} pending for other ranks in {work}; then run "
                  f"`llmkit {stage.name}` (same input and settings) without --rank to assemble "
                  "the artifact", flush=True)
    if runs.rank is None and len(done) < len(stage.phases):
        print(f"{stage.name}: phases up to {phases[-1].name} done in {work}", flush=True)
    return done


def require_rows(stage: str, stats: dict, allow_empty: bool, *, source: str,
                 first_removed: str | None = None, explain: dict[str, str] | None = None,
                 unit: str = "rows") -> None:
    """Refuse an output without rows, unless `allow_empty`: a UserError naming the stage, its
    input (`source`), the commonest reasons in `stats["removed_by_reason"]` with their counts
    (`explain` turns a reason code into words) and the first removed row. Called before the
    commit, so that nothing is written."""
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
