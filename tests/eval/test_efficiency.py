import json

import pytest
import torch

import llmkit.model.decoding
from llmkit.eval.efficiency import EfficiencyConfig, evaluate_efficiency, measure_generation
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
    monkeypatch.setattr(llmkit.model.decoding, "generate", device.generate)
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


class InTurnEngine:
    """An engine like llama.cpp's binding: one sequence at a time, each costing 0.25 s of prefill
    and 0.125 s per further token, on the simulated clock."""

    name, batched, vocab_size, max_len, parameters = "in-turn", False, 64, 128, None

    def __init__(self):
        self.now, self.calls = 100.0, []

    def clock(self) -> float:
        return self.now

    def generate(self, ids, new_tokens):
        self.calls.append((len(ids), new_tokens))
        self.now += len(ids) * (0.25 + 0.125 * (new_tokens - 1))
        return torch.zeros(len(ids), new_tokens, dtype=torch.long)


def test_requests_served_in_turn_finish_one_after_another_and_percentiles_say_so():
    engine = InTurnEngine()
    run = measure_generation(engine, batch_size=4, prompt_tokens=8, new_tokens=5, repeats=2,
                             device=torch.device("cpu"), clock=engine.clock)
    # a whole reply is 0.75 s per prompt: the 4 requests of a run finish at 0.75, 1.5, 2.25, 3 s
    assert engine.calls == [(4, 5), (4, 1), (4, 1)] + [(1, 5)] * 8
    assert run["latency_s"] == 3.0 and run["time_to_first_token_s"] == 1.0
    assert run["request_latency_p50_s"] == (1.5 + 2.25) / 2  # 8 requests: 2 of each
    assert run["request_latency_p95_s"] == 3.0
    assert run["prefill_tokens_per_s"] == 4 * 8 / 1.0 and run["tokens_per_s_runs"] == [4 * 5 / 3.0] * 2


def test_batched_requests_finish_together_and_each_run_s_throughput_is_kept(monkeypatch):
    noise = [9.0, 0.5, 0.0, 0.0625, 0.0, 1.0, 0.125]
    device = SimulatedDevice(noise)
    monkeypatch.setattr(llmkit.model.decoding, "generate", device.generate)
    run = measure_generation(tiny_model(64), batch_size=2, prompt_tokens=8, new_tokens=4, repeats=3,
                             device=torch.device("cpu"), clock=device.clock)
    latencies = sorted([1.25, 1.25 + 1.0, 1.25 + 0.125])  # 2 × (0.25 + 3 × 0.125) + noise
    assert run["tokens_per_s_runs"] == [8 / t for t in (1.25, 2.25, 1.375)]
    assert run["request_latency_p50_s"] == latencies[1]  # 6 requests, 2 per run
    assert run["request_latency_p95_s"] == latencies[2]
    assert run["prefill_tokens_per_s"] == 2 * 8 / run["time_to_first_token_s"]


def llmkit_cli(*args):
    from typer.testing import CliRunner

    from llmkit.cli.app import build_app

    return CliRunner().invoke(build_app(), [str(a) for a in args])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from tests.train.posttrain_fixtures import make_tokenizer, write_checkpoint_run

    tmp = tmp_path_factory.mktemp("efficiency")
    tok = make_tokenizer(tmp / "tok")
    ws = tmp / "ws"
    model = tiny_model(tok.vocab_size, seed=1).eval()
    write_checkpoint_run(ws, "pretrain", model, tok)
    r = llmkit_cli("export", "--from", "pretrain", "--format", "hf", "-w", ws)
    assert r.exit_code == 0, r.output
    return ws, model


def test_an_exported_folder_is_measured_through_transformers_beside_the_run(exported):
    ws, _ = exported
    r = llmkit_cli("eval", "--from", "pretrain", "-w", ws, "--set", "tasks=efficiency",
                   "--set", "efficiency.batch_sizes=2", "--set", "efficiency.prompt_tokens=8",
                   "--set", "efficiency.new_tokens=4", "--set", "efficiency.repeats=3",
                   "--set", f"efficiency.models={ws / 'export' / 'hf'}")
    assert r.exit_code == 0, r.output
    ours = json.loads((ws / "eval" / "pretrain" / "results.json").read_text())["efficiency"]
    [(path, theirs)] = ours["models"].items()
    assert path == str(ws / "export" / "hf") and (ours["engine"], theirs["engine"]) == ("llmkit", "transformers")
    # the same tensors: the same bytes of weights, less each file's header (its metadata differs)
    assert ours["size"]["tensor_bytes"] == theirs["size"]["tensor_bytes"] == 4 * ours["parameters"]
    assert theirs["parameters"] == ours["parameters"]
    for form in (ours, theirs):
        [run] = form["runs"]
        assert len(run["tokens_per_s_runs"]) == 3 and run["request_latency_p95_s"] >= run["request_latency_p50_s"]
        assert form["peak_memory"]["bytes"] >= form["peak_memory"]["before_bytes"] > 10 << 20


def test_transformers_generates_the_tokens_llmkit_does_so_both_time_the_same_work(exported):
    from llmkit.eval.efficiency import LlmkitEngine, TransformersEngine

    ws, model = exported
    ids = torch.randint(0, model.config.vocab_size, (3, 8), generator=torch.Generator().manual_seed(0))
    cpu = torch.device("cpu")
    theirs = TransformersEngine(ws / "export" / "hf", cpu).generate(ids, 12)
    assert theirs.shape == (3, 12) and torch.equal(LlmkitEngine(model, cpu).generate(ids, 12), theirs)


def test_a_model_efficiency_cannot_serve_exits_2_naming_the_fix(exported, monkeypatch, tmp_path):
    import sys

    ws, _ = exported
    gguf = tmp_path / "model-f16.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # the binding not installed
    base = ["eval", "--from", "pretrain", "-w", ws, "--set", "tasks=efficiency", "--out", "bad"]
    cases = [(gguf, "make llama-cpp"), (ws / "pretrain", "neither a transformers folder")]
    for model, named in cases:
        r = llmkit_cli(*base, "--set", f"efficiency.models={model}")
        assert r.exit_code == 2 and named in r.output, (model, r.output)
