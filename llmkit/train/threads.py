"""The CPU threads a training process computes on (`threads`; 0 = chosen here), and a watch on
step times that says when other processes take the cores from under it.

An OpenMP parallel region ends when its slowest thread does. When another process holds one of
the cores, every matmul waits for the scheduler to hand the pushed-out thread its turn again,
and a step slows several times (measured on 2 cores shared with other jobs: a LoRA step took
1.4-2.2 s on 1 thread and 4.3-39 s on 2). So `threads: 0` takes the cores this process may use
(its CPU affinity and cgroup quota, never more than torch's own default, shared among the
processes of one node) less the ones other processes keep busy when the run starts. An explicit
OMP_NUM_THREADS is kept as it is, and `threads: N` is taken as given. Numerics do not depend on
the choice for small tensors, but may in the last bits for large ones: pin `threads` for
bitwise-equal resumes on a machine whose load changes.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import deque
from pathlib import Path

SWING = 3.0  # the slowest recent step over the median that counts as a swing
WINDOW = 10  # recent steps compared
MIN_STEPS = 5  # steps needed before comparing (the first step of a process is never counted)
SAMPLE_S = 0.25  # how long the other processes' load is measured at the start


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, within its cgroup's CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs' worth of time the cgroup may use (a container's --cpus), None when unlimited."""
    try:
        v2 = root / "cpu.max"
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 else None
    except (OSError, ValueError):
        return None


def busy_cores(cpus, seconds: float = SAMPLE_S, stat: Path = Path("/proc/stat")) -> float:
    """How many of `cpus` other processes kept busy over the next `seconds` (this process sleeps
    meanwhile); 0.0 where /proc/stat cannot be read."""
    before = _cpu_times(stat, cpus)
    time.sleep(seconds)
    after = _cpu_times(stat, cpus)
    busy = 0.0
    for cpu, (idle, total) in after.items():
        if cpu in before and total > before[cpu][1]:
            busy += 1 - (idle - before[cpu][0]) / (total - before[cpu][1])
    return busy


def _cpu_times(stat: Path, cpus) -> dict[int, tuple[int, int]]:
    """{cpu: (idle + iowait jiffies, all jiffies)} of the `cpuN` lines of /proc/stat."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
            out[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return out


def auto_threads() -> tuple[int, str | None]:
    """(threads for `threads: 0`, a note when other processes' load lowered them, else None)."""
    import torch

    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return torch.get_num_threads(), None
    per_node = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))  # torchrun's processes here
    cores = max(1, min(usable_cores(), torch.get_num_threads()) // per_node)
    if cores == 1 or per_node > 1:  # nothing to lower; the node's processes load each other
        return cores, None
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    taken = int(busy_cores(cpus) + 0.5)
    threads = max(1, min(cores, len(cpus) - taken))
    if threads == cores:
        return threads, None
    return threads, (f"training on {threads} CPU thread{'s' * (threads > 1)}: other processes keep "
                     f"{taken} of the {len(cpus)} cores busy, and a thread that waits for a busy core "
                     f"stalls every step (--set threads={cores} to use {cores} anyway)")


class CpuThreads:
    """The threads torch computes on during a run: `with CpuThreads.start(...) as t:` sets them
    and gives the previous count back at the end; `t.watch(step_s)` warns once when step times
    swing."""

    def __init__(self, count: int, previous: int, on_cpu: bool, enabled: bool, note=print):
        self.count, self.previous, self.on_cpu, self.enabled = count, previous, on_cpu, enabled
        self.note = note  # how the run talks to its user (the console line's `note`)
        self.times: deque[float] = deque(maxlen=WINDOW)
        self.steps = 0
        self.warned = False

    @classmethod
    def start(cls, setting: int, dist, note=print) -> "CpuThreads":
        """Set torch's threads for `setting` (0 = `auto_threads`) in process `dist` (its `device`
        and `is_main`); on the main process `note` says why when other processes' load lowered
        them."""
        import torch

        previous = torch.get_num_threads()
        count, why = (setting, None) if setting > 0 else auto_threads()
        torch.set_num_threads(count)
        if why and dist.is_main:
            note(why)
        return cls(count, previous, not str(dist.device).startswith("cuda"), dist.is_main, note)

    def __enter__(self) -> "CpuThreads":
        return self

    def __exit__(self, *exc) -> None:
        import torch

        torch.set_num_threads(self.previous)

    def watch(self, step_s: float) -> None:
        """Count a step's time; warn once when the slowest of the recent steps took more than
        SWING times their median on a CPU run with several threads."""
        self.steps += 1
        if self.steps == 1:  # first-call allocations and lazy set-up
            return
        self.times.append(step_s)
        if self.warned or not (self.enabled and self.on_cpu) or self.count < 2 or len(self.times) < MIN_STEPS:
            return
        slowest, median = max(self.times), statistics.median(self.times)
        if slowest > SWING * median:
            self.warned = True
            self.note("warning: " + swing_warning(slowest, median, len(self.times), self.count))


def swing_warning(slowest: float, median: float, steps: int, threads: int) -> str:
    return (f"step times swing: the slowest of the last {steps} steps took {slowest:.2f} s, "
            f"{slowest / median:.1f}x their median {median:.2f} s. Other processes are probably "
            f"taking this machine's cores, and each step waits for the slowest of its {threads} "
            "threads: on a busy machine --set threads=1 (or OMP_NUM_THREADS=1) is often several "
            "times faster")
