"""How the cost per token of the chunked gated delta rule grows with the sequence (CPU, fp32):
forward and forward + backward of one Gated DeltaNet layer (`llmkit.model.gated_deltanet`) and of one
full-attention layer (`llmkit.model.transformer.Attention`, SDPA's causal path: quadratic in the sequence) at
512 .. 4096 tokens, and of a whole tiny Qwen3.5 (3 linear : 1 full). Layer shapes are those of
bench/decode_qwen35.py's ~100M model (hidden 640; Gated DeltaNet 4 key / 8 value heads of 128; attention
8 query / 2 key-value heads of 256). Batch 1, the median of `--reps` timings after one warm-up, in
this process with `--threads` threads. Prints ms per token at each length and its ratio to the
shortest length's (1.0 = linear; attention's grows with the length).

    python bench/delta_rule_scaling.py [--lengths 512,1024,2048,4096] [--threads 1] [--reps 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# bench/ holds a tokenize.py, which would shadow the standard library's `tokenize` module
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"] + [str(REPO)]

import argparse  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402


SHAPE = dict(vocab_size=32000, hidden_size=640, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=2,
             head_dim=256, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=128,
             linear_value_head_dim=128, linear_conv_kernel_dim=4, max_position_embeddings=8192,
             tie_word_embeddings=True)


def config(layer_types):
    import transformers

    from llmkit.hf.mapping import from_hf_config

    hf = transformers.Qwen3_5TextConfig(**SHAPE, num_hidden_layers=len(layer_types), layer_types=layer_types)
    return from_hf_config(hf.to_dict())


def timer(fn, reps: int) -> float:
    """The median seconds of fn() over reps calls, after one warm-up."""
    fn()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--lengths", default="512,1024,2048,4096")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                        help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    a = parser.parse_args()
    if a.quick:
        a.lengths, a.reps = "256,512", 1

    import torch

    from llmkit.model.gated_deltanet import GatedDeltaNet
    from llmkit.model.transformer import Attention, Transformer, rope_tables

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    lengths = [int(n) for n in a.lengths.split(",")]
    cfg = config(["linear_attention"] * 3 + ["full_attention"])
    deltanet, attention = GatedDeltaNet(cfg, 0), Attention(cfg, 3)
    small = config(["linear_attention"] * 3 + ["full_attention"])
    model = Transformer(small)
    cos, sin = rope_tables(cfg)

    def layer_call(name, T):
        x = torch.randn(1, T, cfg.hidden_size)
        if name == "gated deltanet":
            return lambda: deltanet(x)
        if name == "attention":
            return lambda: attention(x, cos[:T], sin[:T], None, True, None)
        ids = torch.randint(0, cfg.vocab_size, (1, T))
        return lambda: model(ids, targets=ids)

    print(f"1 row, fp32, {a.threads} threads, median of {a.reps} after a warm-up; load "
          f"{os.getloadavg()[0]:.2f} before")
    for name in ("gated deltanet", "attention", "4-layer model (3 linear : 1 full, vocabulary 32000)"):
        for mode in ("forward", "forward+backward"):
            per_token = []
            for T in lengths:
                call = layer_call(name.split(" (")[0] if name.startswith("4") else name, T)
                if mode == "forward":
                    def run(call=call):
                        with torch.no_grad():
                            call()
                else:
                    def run(call=call):
                        out = call()
                        (out if out.dim() == 0 else out.float().square().mean()).backward()
                per_token.append(timer(run, a.reps) / T * 1e3)
            cells = "  ".join(f"{T}: {ms:.3f} ms/token (x{ms / per_token[0]:.2f})" for T, ms in zip(lengths, per_token))
            print(f"  {name}, {mode}: {cells}", flush=True)
    print(f"load {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
