import torch

from llmkit.eval.efficiency import EfficiencyConfig, evaluate_efficiency
from tests.train.posttrain_fixtures import tiny_model


def test_efficiency_reports_latency_throughput_and_memory_per_batch_size():
    cfg = EfficiencyConfig(batch_sizes=[1, 3], prompt_tokens=8, new_tokens=4, repeats=1)
    got = evaluate_efficiency(tiny_model(64), cfg, device=torch.device("cpu"))
    assert [r["batch_size"] for r in got["runs"]] == [1, 3]
    for r in got["runs"]:
        assert r["time_to_first_token_s"] > 0 and r["latency_s"] > 0  # timings: no order under load
        assert r["tokens_per_s"] == r["batch_size"] * 4 / r["latency_s"]
        assert r["decode_tokens_per_s"] > 0
    assert got["peak_memory"]["kind"] == "peak_rss" and got["peak_memory"]["bytes"] > 10 << 20
    assert got["parameters"] == tiny_model(64).num_parameters()
