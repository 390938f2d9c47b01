"""The CPU threads a training process computes on (`threads`; 0 = chosen here and adapted
during the run), and a watch on step times that says when other processes take the cores from
under it.

An OpenMP parallel region ends when its slowest thread does. When another process holds one of
the cores, every matmul waits for the scheduler to hand the pushed-out thread its turn again,
and a step slows several times (measured on 2 cores shared with other jobs: a LoRA step took
1.4-2.2 s on 1 thread and 4.3-39 s on 2; DPO steps beside one niced busy job swung between 5,561
and 185 tokens/s). So `threads: 0` takes the cores this process may use (its CPU affinity and
cgroup quota, never more than torch's own default, shared among the processes of one node) less
the ones other processes keep busy when the run starts, and then adapts while it runs
(`next_threads`): one thread fewer when step times swing or other processes keep a core it uses
busy, all of them again once the others have left the cores free for a while. Niced processes
do not count as busy (`_cpu_times`): they yield to a run at normal priority; a swing still does. An explicit
OMP_NUM_THREADS is kept as it is, and `threads: N` is taken as given (a swing then only warns).
Each count and change is recorded (`CpuThreads.history`: metrics.jsonl's `threads`, the run's
manifest). Numerics do not depend on the choice for small tensors, but may in the last bits for
large ones: pin `threads` for bitwise-equal resumes on a machine whose load changes.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

SWING = 3.0  # a step this many times slower than the recent median stalled
STALLS = 2  # stalled steps among the recent ones that make a swing (one alone may be a hiccup)
WINDOW = 10  # recent steps compared
MIN_STEPS = 5  # steps needed before comparing (the first step of a process is never counted)
SAMPLE_S = 0.25  # how long the other processes' load is measured at the start
READ_S = 1.0  # the shortest span the others' load is read over during a run (/proc/stat ticks are 10 ms)
QUIET = 0.25  # the others' load, in cores, that still leaves this process's cores free
QUIET_READINGS = 2  # free readings in a row before the threads go back up...
MOST_QUIET_READINGS = 64  # ...doubled, up to this, each time a raise stalled again


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


def _cpu_times(stat: Path, cpus, niced_yield: bool | None = None) -> dict[int, tuple[int, int]]:
    """{cpu: (free jiffies, all jiffies)} of the `cpuN` lines of /proc/stat. Free: idle and
    iowait, and the time of niced processes (`nice` > 0) while this one is not niced itself
    (`niced_yield`, default: it is not): the scheduler gives a `nice -n 19` job ~1.5% of a core
    beside a normal one, so it stalls no thread (measured: 2 threads beside a niced busy loop step
    as fast as on a quiet machine, and a demo that gave that core up took 1.6x as long)."""
    if niced_yield is None:
        niced_yield = os.getpriority(os.PRIO_PROCESS, 0) <= 0
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
            out[int(name[3:])] = (ticks[3] + ticks[4] + ticks[1] * niced_yield, sum(ticks))
    return out


class OthersLoad:
    """The cores of `cpus` that other processes keep busy while this one runs: /proc/stat's busy
    time on them less this process's own CPU time (it runs on them alone), over the wall time
    since the previous reading. `clock` and `own` (this process's CPU seconds) are injectable."""

    def __init__(self, cpus, stat: Path = Path("/proc/stat"), clock=time.monotonic,
                 own=time.process_time):
        self.cpus, self.stat, self.clock, self.own = set(cpus), stat, clock, own
        self.tick_s = 1 / os.sysconf("SC_CLK_TCK")
        self.last = self._sample()

    def read(self, min_s: float = READ_S) -> float | None:
        """The others' cores since the previous reading; None until `min_s` have passed, or
        where /proc/stat cannot be read."""
        if self.clock() - self.last[0] < min_s:
            return None
        (then, busy_then, own_then), self.last = self.last, self._sample()
        now, busy_now, own_now = self.last
        if busy_then is None or busy_now is None:
            return None
        return max(0.0, (busy_now - busy_then - (own_now - own_then)) / (now - then))

    def _sample(self) -> tuple[float, float | None, float]:
        times = _cpu_times(self.stat, self.cpus)
        busy = sum(total - idle for idle, total in times.values()) * self.tick_s if times else None
        return self.clock(), busy, self.own()


def thread_ceiling() -> int:
    """The most threads `threads: 0` takes: the usable cores, never more than torch's current
    count, shared among the processes of one node (torchrun's LOCAL_WORLD_SIZE)."""
    import torch

    return max(1, min(usable_cores(), torch.get_num_threads()) // processes_per_node())


def processes_per_node() -> int:
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))


def auto_threads() -> tuple[int, str | None]:
    """(threads for `threads: 0`, a note when other processes' load lowered them, else None)."""
    import torch

    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return torch.get_num_threads(), None
    cores = thread_ceiling()
    if cores == 1 or processes_per_node() > 1:
        return cores, None  # nothing to lower; the node's processes load each other
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    taken = int(busy_cores(cpus) + 0.5)
    threads = max(1, min(cores, len(cpus) - taken))
    if threads == cores:
        return threads, None
    return threads, (f"training on {threads} CPU thread{'s' * (threads > 1)}: other processes keep "
                     f"{taken} of the {len(cpus)} cores busy, and a thread that waits for a busy core "
                     f"stalls every step (--set threads={cores} to use {cores} anyway)")


def stalls(costs: Sequence[float]) -> tuple[float, float] | None:
    """(slowest, median) of the recent steps' costs when at least STALLS of them took over SWING
    times their median (a swing), else None; None before MIN_STEPS steps."""
    if len(costs) < MIN_STEPS:
        return None
    median = statistics.median(costs)
    stalled = [c for c in costs if c > SWING * median]
    return (max(stalled), median) if len(stalled) >= STALLS else None


def next_threads(threads: int, most: int, cpus: int, costs: Sequence[float], others: float | None,
                 quiet_readings: int, quiet_needed: int) -> tuple[int, str | None]:
    """The threads for the next steps, and why they change (None: they stay).

    threads: in use; most: the ceiling; cpus: the cores this process may run on; costs: the
    recent steps' seconds per token at this count; others: the cores other processes kept busy
    over the latest reading (None: no new reading); quiet_readings: the readings in a row in
    which they left `most` cores free; quiet_needed: how many it takes to go back up.
    """
    if threads > 1:
        taken = int(others + 0.5) if others is not None else 0
        if cpus - taken < threads:
            return max(1, cpus - taken), f"other processes keep {taken} of the {cpus} cores busy"
        if swing := stalls(costs):
            slowest, median = swing
            return threads - 1, f"step times swing ({slowest / median:.0f}x the median)"
    if threads < most and quiet_readings >= quiet_needed:
        return most, "the cores are free again"
    return threads, None


class CpuThreads:
    """The threads torch computes on during a run: `with CpuThreads.start(...) as t:` sets them
    and gives the previous count back at the end; `t.watch(step, step_s, tokens)` after each step
    adapts them (`next_threads`, with a `load` to read: `threads: 0` on one CPU process) or else
    warns once when step times swing. `history` lists each count and the step it started at."""

    def __init__(self, count: int, previous: int, on_cpu: bool, enabled: bool, note=print,
                 most: int | None = None, load: OthersLoad | None = None, setting: str = ""):
        self.count, self.previous, self.on_cpu, self.enabled = count, previous, on_cpu, enabled
        self.note = note  # how the run talks to its user (the console line's `note`)
        self.most, self.load, self.setting = max(most or count, count), load, setting
        self.adaptive = load is not None and on_cpu and self.most > 1
        self.times: deque[float] = deque(maxlen=WINDOW)
        self.steps = 0
        self.warned = False
        self.quiet, self.quiet_needed, self.raised = 0, QUIET_READINGS, False
        self.history = [{"step": 1, "threads": count}]

    @classmethod
    def start(cls, setting: int, dist, note=print) -> "CpuThreads":
        """Set torch's threads for `setting` (0 = `auto_threads`, adapted during the run) in
        process `dist` (its `device`, `is_main` and `world_size`); on the main process `note`
        says why when other processes' load lowered or changed them."""
        import torch

        previous = torch.get_num_threads()
        explicit = os.environ.get("OMP_NUM_THREADS", "").strip()
        count, why = (setting, None) if setting > 0 else auto_threads()
        adapt = setting == 0 and not explicit and getattr(dist, "world_size", 1) == 1 and \
            processes_per_node() == 1 and hasattr(os, "sched_getaffinity")
        most = thread_ceiling() if adapt else count
        torch.set_num_threads(count)
        if why and dist.is_main:
            note(why)
        on_cpu = not str(dist.device).startswith("cuda")
        named = f"threads={setting}" if setting else f"OMP_NUM_THREADS={explicit}" if explicit else "auto"
        load = OthersLoad(os.sched_getaffinity(0)) if adapt and on_cpu else None
        return cls(count, previous, on_cpu, dist.is_main, note, most, load, named)

    def __enter__(self) -> "CpuThreads":
        return self

    def __exit__(self, *exc) -> None:
        import torch

        torch.set_num_threads(self.previous)

    def watch(self, step: int, step_s: float, tokens: int = 0) -> None:
        """Count step `step`'s time (per token, where it has tokens: batches vary in length) and
        adapt the threads for the steps after it, or warn once about a swing."""
        self.steps += 1
        if self.steps == 1:  # first-call allocations and lazy set-up
            return
        self.times.append(step_s / tokens if tokens > 0 else step_s)
        if not self.adaptive:
            self._warn_on_swing()
            return
        others, cpus = self.load.read(), len(self.load.cpus)
        if others is not None:  # free: the others leave this process the cores of its ceiling
            self.quiet = self.quiet + 1 if others <= cpus - self.most + QUIET else 0
        count, why = next_threads(self.count, self.most, cpus, list(self.times), others, self.quiet,
                                  self.quiet_needed)
        if count != self.count:
            self.change(step + 1, count, why)

    def change(self, step: int, count: int, why: str) -> None:
        """Compute on `count` threads from step `step` on, saying why."""
        import torch

        if count < self.count and self.raised:  # the cores were not free after all: wait longer
            self.quiet_needed = min(2 * self.quiet_needed, MOST_QUIET_READINGS)
        self.raised = count > self.count
        if self.enabled:
            self.note(f"training on {count} CPU thread{'s' * (count > 1)} from step {step} "
                      f"(was {self.count}): {why}")
        torch.set_num_threads(count)
        self.count, self.quiet = count, 0
        self.times.clear()
        self.history.append({"step": step, "threads": count, "why": why})

    def resume(self, history: list, step: int) -> None:
        """Continue the `history` of a run resumed after `step` (empty: a checkpoint older than it)."""
        kept = [h for h in history if h["step"] <= step]
        if not kept or kept[-1]["threads"] != self.count:
            kept.append({"step": step + 1, "threads": self.count, **({"why": "resumed"} if kept else {})})
        self.history = kept

    def record(self, last_step: int) -> dict:
        """What the run's manifest says of its threads: the setting, the count it started on,
        the steps computed on each count, and each change."""
        steps: dict[str, int] = {}
        for h, until in zip(self.history, [h["step"] for h in self.history[1:]] + [last_step + 1]):
            steps[str(h["threads"])] = steps.get(str(h["threads"]), 0) + max(0, until - h["step"])
        return {"setting": self.setting, "start": self.history[0]["threads"], "steps": steps,
                "changes": self.history[1:]}

    def _warn_on_swing(self) -> None:
        if self.warned or not (self.enabled and self.on_cpu) or self.count < 2:
            return
        if swing := stalls(self.times):
            self.warned = True
            self.note("warning: " + swing_warning(*swing, len(self.times), self.count))


def threads_label(record: dict | None, short: bool = False) -> str:
    """`2 threads`, or `1-2 threads (1 on 96% of steps)` (`short`: `1-2 threads`), of a
    manifest's `threads` record; "" without one."""
    if not isinstance(record, dict) or not record.get("steps"):
        return ""
    steps = {int(k): v for k, v in record["steps"].items() if v}
    if len(steps) <= 1:
        n = next(iter(steps), record.get("start", 0))
        return f"{n} thread{'s' * (n != 1)}"
    label = f"{min(steps)}-{max(steps)} threads"
    most_used = max(steps, key=steps.get)
    share = 100 * steps[most_used] / sum(steps.values())
    return label if short else f"{label} ({most_used} on {share:.0f}% of steps)"


def cpu_kernel_path(device: str) -> str:
    """The kernels a run's CPU work goes through: `llmkit-avx512` where llmkit's own
    (`llmkit.model.cpu_kernels`) load here, else `torch`; `cuda` for a run on a GPU."""
    if str(device).startswith("cuda"):
        return "cuda"
    from llmkit.model import cpu_kernels

    return "llmkit-avx512" if cpu_kernels.available() else "torch"


def swing_warning(slowest: float, median: float, steps: int, threads: int) -> str:
    return (f"step times swing: the slowest of the last {steps} steps took {slowest / median:.1f}x "
            f"their median. Other processes are probably "
            f"taking this machine's cores, and each step waits for the slowest of its {threads} "
            "threads: on a busy machine --set threads=1 (or OMP_NUM_THREADS=1) is often several "
            "times faster")
