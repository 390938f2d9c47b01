"""Running an experiment's runs, each as the command a user would type.

A run is `llmkit <stage> …` executed through llmkit's own command line (the function the CLI
hands over: the library does not import the CLI), in this process when `processes` is 1, else in
a pool of that many local worker processes, each of which imports torch once and runs one run at
a time. Its output goes to `runs/<name>.log`. Resuming is the stages' own: a finished run answers
"up to date" from its fingerprint, a killed training run continues from its last complete step
folder, so a killed ablate rerun redoes only what was cut short. Worker processes die with the
ablate process (Linux), so no orphan keeps training into a folder the rerun needs.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from llmkit.ablate.plan import Plan, Run, thread_settings
from llmkit.core.targets import MANIFEST
from llmkit.errors import UserError

Llmkit = Callable[[list[str]], object]  # llmkit's command line: `main(["pretrain", "--in", ...])`


def run_command(llmkit: Llmkit, command: list[str], log: Path) -> int:
    """`llmkit COMMAND` in this process, its output appended to `log`; its exit status."""
    argv = sys.argv
    with open(log, "a", encoding="utf-8") as f, redirect_stdout(f), redirect_stderr(f):
        print("$ " + shlex.join(["llmkit", *command]), flush=True)
        sys.argv = ["llmkit", *command]  # what the run's manifest records as the command that built it
        try:
            llmkit(command)
            return 0
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            sys.argv = argv


def die_with_parent() -> None:
    """A worker is killed when the ablate process dies (Linux's parent-death signal)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def manifest_mark(path: Path) -> tuple | None:
    try:
        stat = (path / MANIFEST).stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def threads_per_run(processes: int, threads: int) -> int:
    """`threads`, or with several processes and no choice made, the cores shared among them."""
    return threads or (max(1, (os.cpu_count() or 1) // processes) if processes > 1 else 0)


def run_command_line(run: Run, workspace: Path, runs: Path, threads: int, force: bool = False) -> list[str]:
    """What runs after `llmkit` for `run`."""
    return run.command(workspace, runs, thread_settings(run.stage, threads)) + (["--force"] if force else [])


def run_all(plan: Plan, workspace: Path, runs: Path, llmkit: Llmkit, *, processes: int = 1, threads: int = 0,
            force: bool = False, finished: Callable[[Run], None] = lambda run: None) -> dict[str, str]:
    """Run every run of `plan` (a run after those it needs), `processes` at a time; run name ->
    "trained" or "up to date". `finished(run)` is called as each one ends (to check its metrics
    early); a run that fails stops the rest with a UserError naming its log."""
    runs.mkdir(parents=True, exist_ok=True)
    threads = threads_per_run(processes, threads)
    total, outcome, started = len(plan.runs), {}, {}

    def command(run: Run) -> list[str]:
        return run_command_line(run, workspace, runs, threads, force)

    def begin(run: Run) -> None:
        started[run.name] = (time.time(), manifest_mark(runs / run.name))
        print(f"ablate: [{len(started)}/{total}] {run.name}: llmkit {run.stage} … (log: {runs / run.name}.log)",
              flush=True)

    def end(run: Run, status: int) -> None:
        since, before = started[run.name]
        log = runs / f"{run.name}.log"
        if status == 130:
            raise KeyboardInterrupt(f"{run.name} was interrupted")
        if status != 0:
            tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(True)[-5:])
            raise UserError(f"run {run.name} failed (exit {status}); its log {log} ends:\n{tail}"
                            f"fix it and rerun ablate: finished runs are kept")
        mark = manifest_mark(runs / run.name)
        outcome[run.name] = "up to date" if before is not None and mark == before and not force else "trained"
        print(f"ablate: {run.name}: {outcome[run.name]} ({time.time() - since:.0f} s)", flush=True)
        finished(run)

    if processes == 1:
        for run in plan.runs:
            begin(run)
            end(run, run_command(llmkit, command(run), runs / f"{run.name}.log"))
        return outcome
    import multiprocessing

    waiting = list(plan.runs)
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                             initializer=die_with_parent) as pool:
        running = {}
        try:
            while waiting or running:
                for run in [r for r in waiting if all(n in outcome for n in r.needs)][:processes - len(running)]:
                    waiting.remove(run)
                    begin(run)
                    running[pool.submit(run_command, llmkit, command(run), runs / f"{run.name}.log")] = run
                if not running:
                    raise UserError(f"ablate: runs {', '.join(r.name for r in waiting)} wait on runs that never ran")
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    end(running.pop(future), future.result())
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return outcome
