import itertools
import json

import pytest
import torch

from llmkit.train import metrics


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    metrics._one_thread_matmul_flops.cache_clear()
    yield tmp_path / "cache" / "llmkit" / "cpu_peak_flops.json"
    metrics._one_thread_matmul_flops.cache_clear()


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


def test_cpu_peak_follows_the_threads_of_each_run(monkeypatch):
    # the one-thread rate is measured once per process; runs on other thread counts scale it
    monkeypatch.setattr(metrics, "best_rate_seen", lambda rate: 1e9)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert metrics.measured_cpu_peak_flops(size=64, repeats=2) == 2e9
        torch.set_num_threads(1)
        assert metrics.measured_cpu_peak_flops(size=64, repeats=2) == 1e9
    finally:
        torch.set_num_threads(before)


def tiny_model(**overrides):
    from llmkit.model.transformer import Transformer
    from llmkit.model.config import ModelConfig

    return Transformer(ModelConfig(vocab_size=64, hidden_size=16, n_layers=2, n_heads=2, n_kv_heads=1,
                                   intermediate_size=32, max_seq_len=16, **overrides))


def attention_and_norm_flops(model, seq_len):
    """What model.flops_per_token counts beside the matmul weights: 6 per norm weight, and attention."""
    cfg = model.config
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    return 6 * norms + 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len


def test_lora_training_flops_count_the_frozen_base_forward_and_backward_not_its_gradients():
    # LoRA SFT logged mfu 107%: its frozen base was counted as trained (6 FLOPs per weight and
    # token) though it computes no weight gradient (4: forward, and the gradient to its input)
    import peft

    model = tiny_model()
    base = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    model.requires_grad_(False)
    peft.inject_adapter_in_model(peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]), model)
    adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert adapters and all(p.requires_grad == ("lora_" in n) for n, p in model.named_parameters())
    flops = metrics.training_flops_per_token(model, model.flops_per_token(16))
    assert flops == 4 * base + 6 * adapters + attention_and_norm_flops(model, 16)
    assert flops < model.flops_per_token(16)


def test_the_mfu_a_lora_run_logs_counts_its_frozen_base(tmp_path):
    # a task without its own figure was counted as 6 x its trainable parameters: the adapters alone
    import peft

    from tests.train.conftest import make_engine

    engine = make_engine(tmp_path / "run", max_steps=2, transformer=True)  # peak_flops 1e9
    model = engine.task.model
    base = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    model.requires_grad_(False)
    peft.inject_adapter_in_model(peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]), model)
    engine.fit()
    first = metrics.read_metrics(tmp_path / "run")[0]
    every_weight = sum(p.numel() for p in model.parameters())
    assert first["mfu"] == pytest.approx((6 * every_weight - 2 * base) * first["tokens_per_s"] / 1e9)


def test_training_flops_of_a_fully_trained_model_are_the_tasks_figure():
    model = tiny_model()
    assert metrics.training_flops_per_token(model, model.flops_per_token(16)) == model.flops_per_token(16)
    assert metrics.training_flops_per_token(model, None) == 6 * model.num_parameters()


def test_frozen_experts_count_for_the_share_of_tokens_routed_to_them():
    model = tiny_model(n_experts=4, experts_top_k=2).requires_grad_(False)
    dense = sum(m.weight.numel() for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and ".experts." not in n)
    experts = sum(m.weight.numel() for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and ".experts." in n)
    assert metrics.frozen_matmul_weights(model) == dense + experts / 2
    flops = metrics.training_flops_per_token(model, model.flops_per_token(16))
    assert flops == 4 * (dense + experts / 2) + attention_and_norm_flops(model, 16)


def test_read_metrics_names_the_line_that_is_not_json(tmp_path):
    from llmkit.errors import UserError

    assert metrics.read_metrics(tmp_path) == []  # a run before its first step
    (tmp_path / metrics.METRICS_FILE).write_text('{"step": 1, "loss": 2.0}\n\n{"step": 2,\n')
    with pytest.raises(UserError, match=r"metrics.jsonl:3 is not JSON"):
        metrics.read_metrics(tmp_path)
