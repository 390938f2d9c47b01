import torch

import llmkit.decoding
from llmkit.eval.efficiency import EfficiencyConfig, evaluate_efficiency
from tests.train.posttrain_fixtures import tiny_model


class SimulatedDevice:
    """A clock and a `generate` whose cost is known: prefill 0.25 s and 0.125 s per further token,
    per prompt, plus this call's noise. Every number is a binary fraction, so timings are exact."""

    def __init__(self, noise):
        self.now, self.noise, self.calls = 100.0, iter(noise), []

    def clock(self) -> float:
        return self.now

    def generate(self, model, ids, max_new_tokens, **kw):
        self.calls.append((len(ids), max_new_tokens))
        self.now += len(ids) * (0.25 + 0.125 * (max_new_tokens - 1)) + next(self.noise)
        return torch.cat([ids, torch.zeros(len(ids), max_new_tokens, dtype=ids.dtype)], 1)


def test_efficiency_reports_median_latency_throughput_and_memory_per_batch_size(monkeypatch):
    # per batch size: one warm-up, 3 first-token runs, 3 whole replies (4 new tokens)
    noise = [9.0, 0.5, 0.0, 0.0625, 0.0, 1.0, 0.125] * 2
    device = SimulatedDevice(noise)
    monkeypatch.setattr(llmkit.decoding, "generate", device.generate)
    cfg = EfficiencyConfig(batch_sizes=[1, 3], prompt_tokens=8, new_tokens=4, repeats=3)
    got = evaluate_efficiency(tiny_model(64), cfg, device=torch.device("cpu"), clock=device.clock)
    assert device.calls == [(1, 4), (1, 1), (1, 1), (1, 1), (1, 4), (1, 4), (1, 4),
                            (3, 4), (3, 1), (3, 1), (3, 1), (3, 4), (3, 4), (3, 4)]
    ttft = {1: 0.25 + 0.0625, 3: 0.75 + 0.0625}  # median noise of the first-token runs
    latency = {1: 0.625 + 0.125, 3: 1.875 + 0.125}
    assert [r["batch_size"] for r in got["runs"]] == [1, 3]
    for r in got["runs"]:
        b = r["batch_size"]
        assert r["time_to_first_token_s"] == ttft[b] and r["latency_s"] == latency[b]
        assert r["tokens_per_s"] == b * 4 / latency[b]
        assert r["decode_tokens_per_s"] == b * 3 / (latency[b] - ttft[b])
    assert got["peak_memory"]["kind"] == "peak_rss" and got["peak_memory"]["bytes"] > 10 << 20
    assert got["parameters"] == tiny_model(64).num_parameters()


def test_real_clock_times_real_generation():
    cfg = EfficiencyConfig(batch_sizes=[2], prompt_tokens=8, new_tokens=4, repeats=1)
    [run] = evaluate_efficiency(tiny_model(64), cfg, device=torch.device("cpu"))["runs"]
    assert run["time_to_first_token_s"] > 0 and run["latency_s"] > 0  # no order under load
    assert run["tokens_per_s"] == 2 * 4 / run["latency_s"]
