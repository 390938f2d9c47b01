import itertools
import json

import pytest
import torch

from llmkit.train import metrics


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    metrics.measured_cpu_peak_flops.cache_clear()
    yield tmp_path / "cache" / "llmkit" / "cpu_peak_flops.json"
    metrics.measured_cpu_peak_flops.cache_clear()


def test_cpu_peak_is_one_threads_matmul_rate_times_the_threads_in_use(monkeypatch):
    # a whole-machine measurement reads low while another process holds a core, and MFU then
    # passes 100%: the peak is measured on one thread and scaled by the threads torch uses
    threads_seen = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: threads_seen.append(torch.get_num_threads())
                        or real_mm(a, b))
    clock = itertools.count(step=0.5)  # every timed matmul takes 0.5 s
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(clock))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        peak = metrics.measured_cpu_peak_flops(size=64, repeats=3)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert set(threads_seen) == {1}
    assert peak == 2 * (2 * 64**3 / 0.5)


def test_cpu_peak_is_the_best_rate_seen_on_this_cpu(private_cache):
    # a measurement taken while a sibling hyperthread was busy reads low: the best one is kept
    assert metrics.best_rate_seen(5e9) == 5e9
    assert metrics.best_rate_seen(3e9) == 5e9
    assert metrics.best_rate_seen(8e9) == 8e9
    assert list(json.loads(private_cache.read_text()).values()) == [8e9]
    private_cache.write_text("not json")
    assert metrics.best_rate_seen(1e9) == 1e9  # a broken cache is rewritten, not fatal


def test_read_metrics_names_the_line_that_is_not_json(tmp_path):
    from llmkit.errors import UserError

    assert metrics.read_metrics(tmp_path) == []  # a run before its first step
    (tmp_path / metrics.METRICS_FILE).write_text('{"step": 1, "loss": 2.0}\n\n{"step": 2,\n')
    with pytest.raises(UserError, match=r"metrics.jsonl:3 is not JSON"):
        metrics.read_metrics(tmp_path)
