"""Inference efficiency: generation latency, throughput and peak memory.

For each batch size, random prompts of `prompt_tokens` are extended by exactly `new_tokens`
greedy tokens with the KV cache (no early stop). Reported (medians over `repeats` runs after one
warm-up): `time_to_first_token_s` (prefill + one token), `latency_s` (the whole reply),
`decode_tokens_per_s` (tokens after the first, over the time after the first) and
`tokens_per_s` (all new tokens over the latency). Peak memory is
`torch.cuda.max_memory_allocated` on a GPU (reset before measuring) and the process's peak
resident set size on the CPU (which includes everything the process held before).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from functools import partial

from llmkit.errors import ConfigError


@dataclass
class EfficiencyConfig:
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8])  # prompts generated together
    prompt_tokens: int = 64     # prompt length
    new_tokens: int = 64        # tokens generated per prompt
    repeats: int = 3            # timed runs per batch size after one warm-up; medians are reported

    def __post_init__(self):
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ConfigError(f"efficiency.batch_sizes must be ≥ 1 each, got {self.batch_sizes}")
        if self.prompt_tokens < 1 or self.new_tokens < 2 or self.repeats < 1:
            raise ConfigError("efficiency needs prompt_tokens ≥ 1, new_tokens ≥ 2, repeats ≥ 1")


def _synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device, clock) -> float:
    _synchronize(device)
    start = clock()
    fn()
    _synchronize(device)
    return clock() - start


def measure_generation(model, *, batch_size: int, prompt_tokens: int, new_tokens: int,
                       repeats: int, device, seed: int = 0, clock=time.perf_counter) -> dict:
    """One batch size's timings; `clock` (seconds, monotonic) is read before and after each
    timed run: first the `repeats` time-to-first-token runs, then the `repeats` whole replies."""
    import torch

    from llmkit.decoding import generate

    cfg = model.config
    if prompt_tokens + new_tokens > cfg.max_seq_len:
        raise ConfigError(f"efficiency: prompt_tokens + new_tokens = {prompt_tokens + new_tokens} "
                          f"exceeds the model's max_seq_len={cfg.max_seq_len}")
    ids = torch.randint(0, cfg.vocab_size, (batch_size, prompt_tokens),
                        generator=torch.Generator().manual_seed(seed)).to(device)
    first = partial(generate, model, ids, 1, greedy=True)
    whole = partial(generate, model, ids, new_tokens, greedy=True)
    whole()  # warm-up: kernels, allocator, caches
    ttft = statistics.median(_timed(first, device, clock) for _ in range(repeats))
    latency = statistics.median(_timed(whole, device, clock) for _ in range(repeats))
    return {"batch_size": batch_size, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
            "time_to_first_token_s": ttft, "latency_s": latency,
            "decode_tokens_per_s": batch_size * (new_tokens - 1) / max(latency - ttft, 1e-9),
            "tokens_per_s": batch_size * new_tokens / latency}


def peak_memory_bytes(device) -> tuple[str, int]:
    import torch

    if device.type == "cuda":
        return "cuda_max_memory_allocated", int(torch.cuda.max_memory_allocated(device))
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return "peak_rss", int(peak if sys.platform == "darwin" else peak * 1024)  # Linux counts KiB


def evaluate_efficiency(model, cfg: EfficiencyConfig, *, device, clock=time.perf_counter) -> dict:
    import torch

    model = model.to(device).eval()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    runs = [measure_generation(model, batch_size=b, prompt_tokens=cfg.prompt_tokens,
                               new_tokens=cfg.new_tokens, repeats=cfg.repeats, device=device,
                               clock=clock)
            for b in cfg.batch_sizes]
    kind, peak = peak_memory_bytes(device)
    return {"device": str(device), "parameters": model.num_parameters(), "runs": runs,
            "peak_memory": {"kind": kind, "bytes": peak}}
