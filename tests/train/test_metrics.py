import itertools

import torch

from llmkit.train import metrics


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
