import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from llmkit.config import config_to_dict
from llmkit.train import threads
from llmkit.train.config import TrainConfig
from llmkit.train.threads import CpuThreads

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


def test_a_setting_is_taken_as_given_and_the_previous_threads_come_back(torch_threads):
    torch.set_num_threads(2)
    with CpuThreads.start(1, CPU) as chosen:
        assert torch.get_num_threads() == 1 == chosen.count
    assert torch.get_num_threads() == 2


def test_swinging_step_times_warn_once_with_the_fix():
    said = []
    watch = CpuThreads(count=2, previous=2, on_cpu=True, enabled=True, note=said.append)
    for step_s in [9.0, 1.0, 1.1, 0.9, 1.0, 1.2, 1.0, 1.1]:  # the first step is never counted
        watch.watch(step_s)
    assert not said
    for step_s in [4.5, 1.0, 5.0]:
        watch.watch(step_s)
    [warning] = said
    assert warning.startswith("warning: step times swing") and "4.50 s" in warning
    assert "--set threads=1" in warning and "OMP_NUM_THREADS=1" in warning


@pytest.mark.parametrize("count, on_cpu", [(1, True), (2, False)])
def test_no_swing_warning_where_threads_are_not_the_cause(count, on_cpu):
    said = []
    watch = CpuThreads(count=count, previous=count, on_cpu=on_cpu, enabled=True, note=said.append)
    for step_s in [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 9.0]:
        watch.watch(step_s)
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
