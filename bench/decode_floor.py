"""The floor under any faster decode step: at a batch of `--batch` rows, the matrix products of every
linear layer of a transformers model (what a decoder must compute per new token, whatever else it
saves) against transformers' own whole decode step with its static cache. The products are timed
three ways: through `F.linear` (MKL's sgemm, what transformers runs), and through the weights
llmkit decodes with (`llmkit.model.packed_linear`): oneDNN's packed layout, and llmkit's panel kernel
where the CPU has AVX-512 (`llmkit.model.cpu_kernels`).

If the ratio (transformers' step / the products alone) is below 2, no implementation on that kernel
decodes at twice transformers' speed per step; dropping finished rows can add at most the ratio of
positions computed (`bench/generate.py` prints both sides').

    python bench/decode_floor.py --export HF_DIR [--batch 16] [--prompt 80] [--threads 2] [--reps 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds a tokenize.py, which would shadow the standard library's `tokenize` module
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--export", help="an `llmkit export` (transformers) folder")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=80, help="tokens in the cache before the timed steps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed calls per measurement")
    a = parser.parse_args()
    if not a.export:
        return print("skip: needs --export, an `llmkit export` folder (e.g. of the SmolLM2 run: make smollm2)")

    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, StaticCache

    from llmkit.model import cpu_kernels
    from llmkit.model.packed_linear import packed_linears

    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.export, dtype=torch.float32).eval()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(a.batch, m.in_features) for m in linears}

    def products_only():
        for m in linears:
            F.linear(inputs[m.in_features], m.weight)

    def packed_products():
        for m in linears:
            m(inputs[m.in_features])  # the packed forward inside packed_linears

    def transformers_step():
        """A decode step after a prefilled static cache; the cache grows by one token per call."""
        cache = StaticCache(config=model.config, max_cache_len=a.prompt + 2 * a.steps + 2)
        model(torch.randint(100, 4000, (a.batch, a.prompt)), past_key_values=cache, use_cache=True,
              cache_position=torch.arange(a.prompt))
        position = [a.prompt]

        def step():
            model(torch.randint(100, 4000, (a.batch, 1)), past_key_values=cache, use_cache=True,
                  cache_position=torch.tensor([position[0]]))
            position[0] += 1
        return step

    def seconds_per_call(f) -> float:
        f()  # warm-up
        started = time.perf_counter()
        for _ in range(a.steps):
            f()
        return (time.perf_counter() - started) / a.steps

    print(f"batch {a.batch}, {len(linears)} linear layers, fp32, {a.threads} threads")
    with torch.no_grad():
        for rep in range(1, a.reps + 1):
            floor, step = seconds_per_call(products_only), seconds_per_call(transformers_step())
            packed = {}
            for kernel, switch in (("oneDNN", "0"), ("panels", "1")):
                os.environ["LLMKIT_CPU_KERNELS"] = switch
                if kernel == "panels" and not cpu_kernels.available():
                    continue  # no AVX-512 (or no compiler) here: oneDNN is what llmkit packs
                with packed_linears(model):
                    packed[kernel] = seconds_per_call(packed_products)
            print(f"  rep {rep}: linear products alone {floor * 1000:.1f} ms (packed: " + ", ".join(
                f"{k} {t * 1000:.1f} ms" for k, t in packed.items()) + f"); transformers' decode step "
                f"{step * 1000:.1f} ms; ratio {step / floor:.2f} (packed: " + ", ".join(
                f"{k} {step / t:.2f}" for k, t in packed.items()) + f"); load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
