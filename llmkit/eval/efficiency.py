"""Inference efficiency: size on disk, peak memory, prefill and decode throughput, per-request latency.

The checkpoint under evaluation is measured through llmkit; `efficiency.models` adds other forms of
the same model, each through the engine that serves it: an exported transformers folder through
transformers, a GGUF file (or an export folder holding one) through llama.cpp's Python binding
(llama-cpp-python; `make llama-cpp` builds it).

For each batch size, random prompts of `prompt_tokens` are extended by exactly `new_tokens` greedy
tokens with the KV cache (no early stop). Reported per batch size, after one warm-up:
`time_to_first_token_s` (median of `repeats` runs of prefill + one token), `latency_s` (median of
`repeats` whole replies), `prefill_tokens_per_s` (prompt tokens over the time to the first token),
`decode_tokens_per_s` (tokens after the first, over the time after the first), `tokens_per_s` (all
new tokens over the latency; each run's value in `tokens_per_s_runs`, whose spread says how much the
machine's load moved the figure) and the per-request latency p50 / p95 over every request of every
run. A batch is one request per prompt: the batched engines (llmkit, transformers) finish all of a
batch's requests together; llama.cpp's binding decodes one sequence at a time, so its requests are
served in turn and the k-th finishes after the k before it.

Size on disk is the weight files' bytes (`file_bytes`) and their tensor data (`tensor_bytes`: the
files less their headers, the figure that is the same for a checkpoint and its transformers export).
Peak memory is `torch.cuda.max_memory_allocated` on a GPU (reset before measuring) and otherwise the
process's peak resident set size while the engine is loaded and measured (Linux: the high-water mark
is reset first), beside the resident size before (`before_bytes`: the process, llmkit's model
included, before this engine was loaded).
"""

from __future__ import annotations

import gc
import json
import statistics
import struct
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from llmkit.errors import ConfigError, UserError


@dataclass
class EfficiencyConfig:
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8])  # prompts generated together
    prompt_tokens: int = 64     # prompt length
    new_tokens: int = 64        # tokens generated per prompt
    repeats: int = 3            # timed runs per batch size after one warm-up; medians are reported
    models: list[str] = field(default_factory=list)  # also measure: exported folders, .gguf files

    def __post_init__(self):
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ConfigError(f"efficiency.batch_sizes must be ≥ 1 each, got {self.batch_sizes}")
        if self.prompt_tokens < 1 or self.new_tokens < 2 or self.repeats < 1:
            raise ConfigError("efficiency needs prompt_tokens ≥ 1, new_tokens ≥ 2, repeats ≥ 1")


# -- engines: prefill + one token, and whole replies, for a batch of prompt ids -------------------

class LlmkitEngine:
    name = "llmkit"
    batched = True

    def __init__(self, model, device):
        self.model, self.device = model.to(device).eval(), device
        self.vocab_size, self.max_len = model.config.vocab_size, model.config.max_seq_len
        self.parameters = model.num_parameters()

    def generate(self, ids, new_tokens: int):
        from llmkit.model.decoding import generate  # looked up per call: tests replace it

        return generate(self.model, ids.to(self.device), new_tokens, greedy=True)[:, ids.shape[1]:]


class TransformersEngine:
    """An exported folder, as transformers serves it (float32, as llmkit's model is measured)."""

    name = "transformers"
    batched = True

    def __init__(self, folder: Path, device):
        import torch
        import transformers

        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32).to(device).eval()
        config = self.model.config
        self.device, self.vocab_size = device, config.vocab_size
        self.max_len = config.max_position_embeddings
        self.parameters = sum(p.numel() for p in self.model.parameters())

    def generate(self, ids, new_tokens: int):
        import torch
        import transformers

        # no eos: every reply is exactly new_tokens long, as llmkit's (no early stop)
        settings = transformers.GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0,
                                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        ids = ids.to(self.device)
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=settings)
        return out[:, ids.shape[1]:]


class LlamaCppEngine:
    """A GGUF file through llama.cpp's binding on the CPU, as many threads as torch uses."""

    name = "llama.cpp"
    batched = False

    def __init__(self, path: Path, context: int):
        import torch

        llama_cpp = import_llama_cpp()
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=context, n_batch=context, n_threads=torch.get_num_threads(),
                                   n_threads_batch=torch.get_num_threads(), seed=0, verbose=False)
        self.vocab_size, self.max_len = self.llm.n_vocab(), self.llm.n_ctx()
        self.parameters = None  # the binding does not say

    def generate(self, ids, new_tokens: int):
        import torch

        return torch.tensor([greedy_llama_cpp(self.llm, row.tolist(), new_tokens) for row in ids])

    def close(self):
        self.llm.close()


def import_llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise UserError("a .gguf model needs llama.cpp's Python binding, which is not installed: "
                        "`make llama-cpp` builds it (or `pip install llama-cpp-python`)") from None
    return llama_cpp


def greedy_llama_cpp(llm, prompt: list[int], new_tokens: int) -> list[int]:
    """`new_tokens` greedy ids after `prompt` from a fresh KV cache; no early stop at eos."""
    import numpy as np

    llama_cpp = import_llama_cpp()
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(new_tokens):
        # the last position's logits, as llama.cpp left them: the binding keeps a copy of every
        # position's only with logits_all, which would also make the prefill compute them all
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        out.append(int(np.argmax(logits)))
        if len(out) < new_tokens:
            llm.eval(out[-1:])
    return out


# -- measuring ------------------------------------------------------------------------------------

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


def _served_in_turn(engine, ids, new_tokens: int, device, clock) -> list[float]:
    """Each request's latency when the prompts are served one after another."""
    done, elapsed = [], 0.0
    for row in ids:
        elapsed += _timed(partial(engine.generate, row[None], new_tokens), device, clock)
        done.append(elapsed)
    return done


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, linearly interpolated between the two nearest ranks (numpy's default)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def measure_generation(engine, *, batch_size: int, prompt_tokens: int, new_tokens: int,
                       repeats: int, device, seed: int = 0, clock=time.perf_counter) -> dict:
    """One batch size's timings; `clock` (seconds, monotonic) is read before and after each
    timed run: first the `repeats` time-to-first-token runs, then the `repeats` whole replies."""
    import torch

    if not hasattr(engine, "generate"):  # an llmkit model
        engine = LlmkitEngine(engine, device)
    if prompt_tokens + new_tokens > engine.max_len:
        raise ConfigError(f"efficiency: prompt_tokens + new_tokens = {prompt_tokens + new_tokens} "
                          f"exceeds the model's context of {engine.max_len} tokens ({engine.name})")
    ids = torch.randint(0, engine.vocab_size, (batch_size, prompt_tokens),
                        generator=torch.Generator().manual_seed(seed))
    engine.generate(ids, new_tokens)  # warm-up: kernels, allocator, caches
    ttft = statistics.median(_timed(partial(engine.generate, ids, 1), device, clock) for _ in range(repeats))
    requests, latencies = [], []
    for _ in range(repeats):
        if engine.batched:
            latencies.append(_timed(partial(engine.generate, ids, new_tokens), device, clock))
            requests += [latencies[-1]] * batch_size
        else:
            requests += _served_in_turn(engine, ids, new_tokens, device, clock)
            latencies.append(requests[-1])
    latency = statistics.median(latencies)
    return {"batch_size": batch_size, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
            "time_to_first_token_s": ttft, "latency_s": latency,
            "prefill_tokens_per_s": batch_size * prompt_tokens / ttft,
            "decode_tokens_per_s": batch_size * (new_tokens - 1) / max(latency - ttft, 1e-9),
            "tokens_per_s": batch_size * new_tokens / latency,
            "tokens_per_s_runs": [batch_size * new_tokens / t for t in latencies],
            "request_latency_p50_s": percentile(requests, 50),
            "request_latency_p95_s": percentile(requests, 95)}


def _proc_status_bytes(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_memory(device) -> int | None:
    """Start a new high-water mark; returns the resident bytes now (None where not known)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return int(torch.cuda.memory_allocated(device))
    try:  # Linux: writing 5 resets the VmHWM peak to the current resident size
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _proc_status_bytes("VmRSS")


def peak_memory_bytes(device) -> tuple[str, int]:
    import torch

    if device.type == "cuda":
        return "cuda_max_memory_allocated", int(torch.cuda.max_memory_allocated(device))
    peak = _proc_status_bytes("VmHWM")
    if peak is not None:
        return "peak_rss", peak
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return "peak_rss", int(peak if sys.platform == "darwin" else peak * 1024)  # Linux counts KiB


def _safetensors_header_bytes(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def weights_size(path: Path) -> dict:
    """The weight files of a step folder, a transformers folder or a GGUF file, on disk."""
    path = Path(path)
    if path.suffix == ".gguf":
        import gguf

        tensors = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)
        return {"files": [path.name], "file_bytes": path.stat().st_size, "tensor_bytes": tensors}
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    if not files:
        raise UserError(f"{path}: no model.safetensors (nor pytorch_model*.bin) to measure")
    headers = sum(_safetensors_header_bytes(f) for f in files if f.suffix == ".safetensors")
    total = sum(f.stat().st_size for f in files)
    return {"files": [f.name for f in files], "file_bytes": total, "tensor_bytes": total - headers}


def measure_engine(engine, cfg: EfficiencyConfig, device, clock, before) -> dict:
    runs = [measure_generation(engine, batch_size=b, prompt_tokens=cfg.prompt_tokens,
                               new_tokens=cfg.new_tokens, repeats=cfg.repeats, device=device, clock=clock)
            for b in cfg.batch_sizes]
    kind, peak = peak_memory_bytes(device)
    return {"engine": engine.name, "device": str(device), "parameters": engine.parameters, "runs": runs,
            "peak_memory": {"kind": kind, "bytes": peak, "before_bytes": before}}


def evaluate_efficiency(model, cfg: EfficiencyConfig, *, device, clock=time.perf_counter,
                        weights: Path | None = None, models: list[Path] = ()) -> dict:
    """The llmkit model's figures (its weight files' size when `weights`, its step folder, is given),
    and under `models` each other form's, by the path given."""
    before = reset_peak_memory(device)
    out = measure_engine(LlmkitEngine(model, device), cfg, device, clock, before)
    if weights is not None:
        out["size"] = weights_size(weights)
    out["models"] = {str(path): evaluate_other_form(Path(path), cfg, device, clock) for path in models}
    return out


def evaluate_other_form(path: Path, cfg: EfficiencyConfig, device, clock) -> dict:
    gc.collect()
    before = reset_peak_memory(device)
    engine, weights = open_engine(path, cfg, device)
    try:
        out = measure_engine(engine, cfg, engine_device(engine, device), clock, before)
    finally:
        getattr(engine, "close", lambda: None)()
    return {**out, "size": weights_size(weights)}


def engine_device(engine, device):
    import torch

    return torch.device("cpu") if isinstance(engine, LlamaCppEngine) else device


def open_engine(path: Path, cfg: EfficiencyConfig, device):
    """(engine, its weights path) for an exported folder or a GGUF file (or a folder holding one)."""
    ggufs = sorted(path.glob("*.gguf")) if path.is_dir() else []
    if path.suffix == ".gguf" or (len(ggufs) == 1 and not (path / "config.json").exists()):
        gguf_file = path if path.suffix == ".gguf" else ggufs[0]
        return LlamaCppEngine(gguf_file, cfg.prompt_tokens + cfg.new_tokens), gguf_file
    if path.is_dir() and (path / "config.json").is_file():
        _require_transformers_folder(path)
        return TransformersEngine(path, device), path
    raise UserError(f"efficiency.models: {path} is neither a transformers folder (config.json + weights, "
                    "as `llmkit export --format hf` writes) nor a .gguf file (`llmkit export --format gguf`)")


def _require_transformers_folder(path: Path) -> None:
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if "model_type" not in config:
        raise UserError(f"efficiency.models: {path}/config.json has no model_type: a checkpoint's step "
                        "folder is measured as the run under evaluation (--from), an export with "
                        "`llmkit export --format hf`")
