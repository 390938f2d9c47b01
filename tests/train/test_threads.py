import os
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from llmkit.core.config import config_to_dict
from llmkit.train import threads
from llmkit.train.config import TrainConfig
from llmkit.train.metrics import read_metrics
from llmkit.train.threads import CpuThreads, OthersLoad, next_threads, threads_label

from tests.train.conftest import make_engine

CPU = SimpleNamespace(device="cpu", is_main=True)


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def stat_lines(*cpus):
    """/proc/stat text: `cpu` then one line per (idle, busy) jiffies pair."""
    rows = [f"cpu{n} {busy} 0 0 {idle} 0 0 0 0 0 0" for n, (idle, busy) in enumerate(cpus)]
    return "\n".join(["cpu  0 0 0 0 0 0 0 0 0 0", *rows, "intr 1 2 3"]) + "\n"


def test_busy_cores_are_the_cores_other_processes_used_while_this_one_slept(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text(stat_lines((1000, 1000), (1000, 1000), (1000, 1000)))
    # over the sample: cpu0 fully busy, cpu1 a quarter busy, cpu2 (not ours) fully busy
    later = stat_lines((1000, 1100), (1075, 1025), (1000, 1100))
    monkeypatch.setattr(threads.time, "sleep", lambda s: stat.write_text(later))
    assert threads.busy_cores({0, 1}, stat=stat) == pytest.approx(1.25)
    assert threads.busy_cores({0}, stat=tmp_path / "missing") == 0.0


@pytest.mark.parametrize("files, quota", [
    ({"cpu.max": "200000 100000\n"}, 2.0),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "150000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.5),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_cgroup_quota_of_a_container(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert threads.cgroup_cpu_quota(tmp_path) == quota


def test_auto_takes_the_free_cores_and_says_why_when_others_hold_some(monkeypatch, torch_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda: None)
    torch.set_num_threads(4)
    monkeypatch.setattr(threads, "busy_cores", lambda cpus: 0.2)
    assert threads.auto_threads() == (4, None)
    monkeypatch.setattr(threads, "busy_cores", lambda cpus: 2.7)
    count, why = threads.auto_threads()
    assert count == 1 and "3 of the 4 cores busy" in why and "--set threads=4" in why
    monkeypatch.setattr(threads, "busy_cores", lambda cpus: 4.0)
    assert threads.auto_threads()[0] == 1  # never none
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda: 1.5)  # a container's --cpus 1.5
    monkeypatch.setattr(threads, "busy_cores", lambda cpus: 0.0)
    assert threads.auto_threads() == (2, None)
    torch.set_num_threads(1)  # set by the caller (a test, an API user): never raised
    assert threads.auto_threads() == (1, None)


def test_auto_keeps_an_explicit_omp_num_threads(monkeypatch, torch_threads):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    torch.set_num_threads(3)
    monkeypatch.setattr(threads, "busy_cores", lambda cpus: pytest.fail("no need to measure"))
    assert threads.auto_threads() == (3, None)


@pytest.mark.skipif(threads.usable_cores() < 2, reason="needs two cores")
def test_a_busy_loop_beside_the_run_lowers_the_auto_threads(monkeypatch, torch_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = threads.usable_cores()
    torch.set_num_threads(cores)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores - 1)]
    try:
        count, why = threads.auto_threads()
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert count < cores and why


@pytest.mark.skipif(threads.usable_cores() < 2, reason="needs two cores")
def test_niced_busy_loops_do_not_count_as_taking_the_cores():
    """A `nice -n 19` job gets ~1.5% of a core beside a run at normal priority: giving it the core
    would cost the run half its speed (the demo beside one took 1.6x as long)."""
    cpus = os.sched_getaffinity(0)
    before = threads.busy_cores(cpus, seconds=0.5)  # whatever else loads the machine now
    loops = [subprocess.Popen([sys.executable, "-c", "import os; os.nice(19)\nwhile True: pass"])
             for _ in cpus]
    try:
        time.sleep(0.2)  # the loops running, niced
        beside = threads.busy_cores(cpus, seconds=0.5)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert beside < before + 0.6, (before, beside)


def test_niced_processes_time_is_free_unless_the_run_is_niced_itself(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  0 0 0 0 0 0 0 0\ncpu0 10 30 5 50 5 0 0 0\n")  # user nice system idle iowait
    assert threads._cpu_times(stat, {0}, niced_yield=True) == {0: (85, 100)}
    assert threads._cpu_times(stat, {0}, niced_yield=False) == {0: (55, 100)}


def test_a_setting_is_taken_as_given_and_the_previous_threads_come_back(torch_threads):
    torch.set_num_threads(2)
    with CpuThreads.start(1, CPU) as chosen:
        assert torch.get_num_threads() == 1 == chosen.count
    assert torch.get_num_threads() == 2


def test_swinging_step_times_warn_once_with_the_fix():
    said = []
    watch = CpuThreads(count=2, previous=2, on_cpu=True, enabled=True, note=said.append)
    for step, step_s in enumerate([9.0, 1.0, 1.1, 0.9, 1.0, 1.2, 1.0, 1.1], 1):  # the first is never counted
        watch.watch(step, step_s)
    assert not said
    for step, step_s in enumerate([4.5, 1.0, 5.0], 9):
        watch.watch(step, step_s)
    [warning] = said
    assert warning.startswith("warning: step times swing") and "4.8x their median" in warning
    assert "--set threads=1" in warning and "OMP_NUM_THREADS=1" in warning


@pytest.mark.parametrize("count, on_cpu", [(1, True), (2, False)])
def test_no_swing_warning_where_threads_are_not_the_cause(count, on_cpu):
    said = []
    watch = CpuThreads(count=count, previous=count, on_cpu=on_cpu, enabled=True, note=said.append)
    for step, step_s in enumerate([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 9.0, 9.0], 1):
        watch.watch(step, step_s)
    assert not said


def test_threads_is_a_run_option_outside_the_fingerprint_that_a_run_may_change():
    assert TrainConfig().threads == 0
    assert config_to_dict(TrainConfig(threads=1))["threads"] == 1
    assert "threads" not in config_to_dict(TrainConfig(threads=1), fingerprint=True)
    assert "threads" in TrainConfig.CONTINUABLE


def test_the_engine_trains_on_the_threads_set_and_gives_them_back(tmp_path, torch_threads):
    torch.set_num_threads(2)
    engine = make_engine(tmp_path / "run", max_steps=2, threads=1)
    seen = []
    loss = engine.task.loss
    engine.task.loss = lambda model, batch: seen.append(torch.get_num_threads()) or loss(model, batch)
    engine.fit()
    assert seen == [1, 1] and torch.get_num_threads() == 2


def test_a_run_whose_step_times_swing_says_so_once_with_the_fix(tmp_path, torch_threads, capsys):
    engine = make_engine(tmp_path / "run", max_steps=9, threads=2)
    loss, calls = engine.task.loss, []

    def stalled_twice(model, batch):  # as when another process holds a core for a while
        calls.append(time.monotonic())
        if len(calls) in (7, 9):  # 5x the slowest of steps 2-6, whatever the machine's load
            time.sleep(5 * max(b - a for a, b in zip(calls[1:5], calls[2:6])))
        return loss(model, batch)

    engine.task.loss = stalled_twice
    engine.fit()
    said = capsys.readouterr().err
    assert said.count("warning: step times swing") == 1 and "--set threads=1" in said


# -- adapting during the run -------------------------------------------------------------------

STEADY = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95]


@pytest.mark.parametrize("costs, threads", [
    (STEADY, 2),
    (STEADY + [4.0], 2),  # one slow step is a hiccup (a collection, a page fault)
    (STEADY + [4.0, 1.0, 30.0], 1),  # two: another process takes a core now and then
    ([1.0, 30.0, 1.0, 30.0], 2),  # too few steps to tell
])
def test_threads_drop_by_one_when_step_times_swing(costs, threads):
    assert next_threads(2, 2, 2, costs, None, 0, 2)[0] == threads
    assert next_threads(1, 2, 2, costs, None, 0, 2) == (1, None)  # never below one


@pytest.mark.parametrize("others, threads", [(0.2, 4), (0.7, 3), (1.4, 3), (2.6, 1), (9.0, 1)])
def test_threads_leave_the_cores_other_processes_keep_busy(others, threads):
    count, why = next_threads(4, 4, 4, STEADY, others, 0, 2)
    assert count == threads and (why is None) == (threads == 4)
    assert why is None or "of the 4 cores busy" in why


def test_threads_go_back_up_once_the_cores_were_free_long_enough():
    assert next_threads(1, 2, 2, STEADY, 0.0, 1, 2) == (1, None)
    assert next_threads(1, 2, 2, STEADY, 0.0, 2, 2) == (2, "the cores are free again")
    assert next_threads(2, 2, 2, STEADY, 0.0, 9, 2) == (2, None)  # at the ceiling already


class ScriptedLoad:
    """OthersLoad's interface with the readings given: one per step, None = no new reading."""

    def __init__(self, readings, cpus=(0, 1)):
        self.readings, self.cpus = iter(readings), set(cpus)

    def read(self):
        return next(self.readings)


def test_a_competitor_lowers_the_threads_and_its_end_raises_them_with_a_growing_wait(torch_threads):
    # per step: (seconds per token, the others' cores read after it; None = no new reading)
    steps = [(1.0, None)] + [(1.0, 0.0)] * 6  # 1-7: a quiet machine
    steps += [(1.0, None), (9.0, None), (1.0, None), (8.0, None)]  # 8-11: a competitor stalls two
    steps += [(1.6, 1.0)] * 3 + [(1.6, 0.0)] * 2  # 12-16 on 1 thread: it runs, then leaves
    steps += [(1.0, None), (9.0, None), (1.0, None), (1.0, None), (9.0, None)]  # 17-21: it is back
    steps += [(1.6, 1.0)] * 3 + [(1.6, 0.0)] * 4  # 22-28: twice the free readings needed now
    steps += [(1.0, None)] * 2  # 29-30
    said = []
    load = ScriptedLoad(reading for _, reading in steps[1:])  # the first step reads nothing
    watch = CpuThreads(2, 2, on_cpu=True, enabled=True, note=said.append, most=2, load=load, setting="auto")
    torch.set_num_threads(2)  # as `CpuThreads.start` does (a test worker computes on one)
    for step, (cost, _) in enumerate(steps, 1):
        watch.watch(step, cost)
        assert torch.get_num_threads() == watch.count
    record = watch.record(len(steps))
    assert [(c["step"], c["threads"]) for c in record["changes"]] == [(12, 1), (17, 2), (22, 1), (29, 2)]
    assert "swing" in record["changes"][0]["why"] and record["changes"][1]["why"] == "the cores are free again"
    assert record == {"setting": "auto", "start": 2, "steps": {"2": 11 + 5 + 2, "1": 5 + 7},
                      "changes": record["changes"]}
    assert len(said) == 4 and said[0].startswith("training on 1 CPU thread from step 12 (was 2): step times swing")


@pytest.mark.parametrize("others, threads", [(1.9, 2), (2.6, 1)])
def test_the_threads_go_back_up_while_others_use_only_the_cores_left_over(others, threads, torch_threads):
    load = ScriptedLoad([None, others, others], cpus=range(4))  # 2 of 4 cores for this run at most
    watch = CpuThreads(1, 2, on_cpu=True, enabled=False, most=2, load=load)
    for step in range(1, 5):
        watch.watch(step, 1.0)
    assert watch.count == threads


def test_a_resumed_run_continues_the_thread_history():
    watch = CpuThreads(1, 1, on_cpu=True, enabled=True, most=2, load=ScriptedLoad([]))
    earlier = [{"step": 1, "threads": 2}, {"step": 40, "threads": 1, "why": "x"}, {"step": 70, "threads": 2, "why": "y"}]
    watch.resume(earlier, 50)  # the change at step 70 belonged to steps retrained now
    assert watch.record(60)["steps"] == {"2": 39, "1": 21}
    watch.resume([], 50)  # a checkpoint from before histories were kept
    assert watch.record(60) == {"setting": "", "start": 1, "steps": {"1": 10}, "changes": []}


def test_others_load_is_the_busy_time_of_the_cores_less_this_process(tmp_path):
    stat, now, own = tmp_path / "stat", [0.0], [0.0]
    tick = 1 / os.sysconf("SC_CLK_TCK")
    stat.write_text(stat_lines((0, 0), (0, 0), (0, 0)))
    load = OthersLoad({0, 1}, stat=stat, clock=lambda: now[0], own=lambda: own[0])
    now[0], own[0] = 2.0, 1.5  # over 2 s: this process 1.5 CPU-s, the cores busy 3.5 s in all
    busy = round(1.75 / tick)
    stat.write_text(stat_lines((round(2 / tick) - busy, busy), (round(2 / tick) - busy, busy), (0, round(2 / tick))))
    assert load.read(min_s=5.0) is None  # too short a span: the next reading covers it
    assert load.read() == pytest.approx(1.0, abs=0.02)
    assert OthersLoad({0}, stat=tmp_path / "missing", clock=lambda: now[0] + 9).read() is None


@pytest.mark.parametrize("steps, label", [
    ({"2": 10}, "2 threads"), ({"1": 10, "2": 0}, "1 thread"),
    ({"2": 4, "1": 96}, "1-2 threads (1 on 96% of steps)"), ({}, "")])
def test_threads_label(steps, label):
    assert threads_label({"start": 2, "steps": steps}) == label
    assert threads_label(None) == ""


@pytest.mark.skipif(threads.usable_cores() < 2, reason="needs two cores")
def test_a_busy_process_started_mid_run_on_its_cores_leaves_the_run_on_fewer_threads(
        tmp_path, monkeypatch, torch_threads):
    """Real time, a real competitor: a busy loop at the run's own priority pinned to its cores
    from half a second (and 10 steps) in on. Whatever else loads this machine, the run ends on fewer threads than it started
    with and its steps take about what they took before the loop on that many threads (not a
    stall's many times)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "busy_cores", lambda cpus: 0.0)  # start on every core
    cores = threads.usable_cores()
    torch.set_num_threads(cores)
    engine = make_engine(tmp_path / "run", max_steps=100_000)
    weight, loss, seen = torch.randn(256, 256), engine.task.loss, {}
    loop = f"import os; os.sched_setaffinity(0, {os.sched_getaffinity(0)})\nwhile True: pass"

    def with_matmuls(model, batch):  # big enough to run on every thread
        now = time.monotonic()
        seen.setdefault("start", now)
        if "busy" not in seen and now - seen["start"] > 0.5 and engine.step >= 10:
            seen["busy"], seen["busy_step"] = subprocess.Popen([sys.executable, "-c", loop]), engine.step + 1
        if "busy" in seen and torch.get_num_threads() < cores:
            seen.setdefault("fewer", now)
        if now - seen.get("fewer", now + 1) > 0.5 or now - seen["start"] > 8.0:
            engine.cfg.max_steps = engine.step + 1  # this step is the last
        x = weight
        for _ in range(4):
            x = torch.tanh(x @ weight)
        return loss(model, batch)

    engine.task.loss = with_matmuls
    try:
        result = engine.fit()
    finally:
        if "busy" in seen:
            seen["busy"].kill()
            seen["busy"].wait()
    records = read_metrics(tmp_path / "run")
    assert "fewer" in seen, f"still on {records[-1]['threads']} threads 7.5 s after a busy loop started"
    assert result.threads["start"] == cores and records[-1]["threads"] < cores
    before = [r["step_s"] for r in records[1:seen["busy_step"] - 1]]
    after = [r for r in records if r["step"] > seen["busy_step"] and r["threads"] < cores][-20:]
    # fewer threads cost their share (cores / threads) and the suite's other work adds its own
    # noise; a stall (threads waiting at every barrier for one the busy loop holds) costs many times
    fair = cores / statistics.median(r["threads"] for r in after)
    assert statistics.median(r["step_s"] for r in after) < 2.5 * fair * statistics.median(before)
