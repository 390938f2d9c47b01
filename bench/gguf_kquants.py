"""Benchmark: `llmkit export --format gguf --quant q4_k_m` (the whole command: a fresh process that
loads the run, lays out the tensors, quantises and writes the file) against llama.cpp's quantiser
(`llama_model_quantize` of llama-cpp-python, in a fresh process) turning llmkit's f16 file of the
same run into q4_k_m; then checks that the two files hold the same tensors, byte for byte.

The run is a random model of SmolLM2-135M's shapes (the `smol-135m` preset: 30 layers, hidden 576,
so its attention matrices fall back to Q5_0 / Q8_0; vocabulary 49152, tied), or any run given.
Each side runs `--runs` times, alternating, beside llmkit's f16 export of the same run (the same
command quantising nothing: what loading and writing cost); the median and the spread are printed with the load
average before and after. Both sides use every core (llama.cpp: nthread 0 = all; llmkit: its
threads over row chunks).

    python bench/gguf_kquants.py [--run WORKSPACE/RUN] [--quant q4_k_m|q3_k_m|q2_k|…] [--runs 3] [--imatrix FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/tokenize.py shadows tokenize
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

LLAMA_CPP_QUANTIZE = """
import ctypes, sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_" + sys.argv[3])
params.nthread = 0
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)))
"""


def smol_run(ws: Path) -> Path:
    """A random model of SmolLM2-135M's shapes, as a checkpoint run `ws/smol`."""
    from llmkit.model.config import model_config
    from llmkit.model.transformer import Transformer
    from tests.train.posttrain_fixtures import make_tokenizer, write_checkpoint_run

    model = Transformer(model_config("smol-135m"))
    model.init_weights(seed=0)
    return write_checkpoint_run(ws, "smol", model, make_tokenizer(ws.parent / "tok"))


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def llmkit_export(run: Path, quant: str, out: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "llmkit", "export", "--from", str(run), "--format", "gguf", "--quant", quant,
            "--to", str(out), "-w", str(run.parent), "--force", "--set", "probe=false", *extra]


def same_tensors(ours: Path, theirs: Path) -> tuple[int, list[str]]:
    import gguf
    import numpy as np

    read = lambda p: {t.name: (t.tensor_type.name, np.asarray(t.data).tobytes()) for t in gguf.GGUFReader(p).tensors}  # noqa: E731
    a, b = read(ours), read(theirs)
    return len(a), sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))


def kernel_seconds() -> None:
    """CPU seconds of one thread, llmkit's kernels against ggml's `ggml_quantize_chunk`, on weights
    of SmolLM2-135M's shapes (an ffn_down, an attention matrix, the embedding); the bytes compared."""
    import ctypes

    import llama_cpp
    import numpy as np

    from llmkit.hf.gguf_kquants import quantize

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    rng = np.random.default_rng(0)
    for name, ggml_type, shape, size, block in (("Q2_K", 10, (576, 1536), 84, 256), ("Q3_K", 11, (576, 1536), 110, 256),
                                                ("Q4_K", 12, (576, 1536), 144, 256), ("Q6_K", 14, (576, 1536), 210, 256),
                                                ("Q4_0", 2, (576, 576), 18, 32), ("Q5_0", 6, (576, 576), 22, 32),
                                                ("Q8_0", 8, (49152, 576), 34, 32)):
        x = (rng.standard_normal(shape) * 0.02).astype(np.float16).astype(np.float32)
        for weights in (None, (rng.random(shape[1]) * 3).astype(np.float32)):
            quantize(x[:64], name, weights, threads=1)
            start = time.process_time()
            ours = quantize(x, name, weights, threads=1)
            mine = time.process_time() - start
            theirs = np.zeros((shape[0], shape[1] // block * size), np.uint8)
            start = time.process_time()
            lib.ggml_quantize_chunk(ggml_type, x.ctypes.data, theirs.ctypes.data, 0, shape[0], shape[1],
                                    None if weights is None else weights.ctypes.data)
            ggml = time.process_time() - start
            print(f"  {name} {shape} {'imatrix' if weights is not None else 'plain  '}: llmkit {mine:.3f} CPU s, "
                  f"ggml {ggml:.3f} ({mine / ggml:.2f}x), bytes {'equal' if np.array_equal(ours, theirs) else 'DIFFER'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="an llmkit checkpoint run (default: a random smol-135m)")
    parser.add_argument("--quant", default="q4_k_m")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--imatrix", type=Path, help="not timed against llama.cpp: llmkit's side only")
    args = parser.parse_args()
    if importlib.util.find_spec("llama_cpp") is None:
        return print("skip: needs llama-cpp-python, the peer (make llama-cpp)")
    if os.environ.get("BENCH_QUICK"):
        args.runs = 1
    from llmkit.hf.gguf_quant_mix import MIXES

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run = args.run or smol_run(tmp / "ws")
        f16 = tmp / "f16"
        subprocess.run(llmkit_export(run, "f16", f16, []), check=True, stdout=subprocess.DEVNULL)
        extra = ["--set", f"imatrix={args.imatrix}"] if args.imatrix else []
        ours, theirs = tmp / "ours", tmp / f"llama-{args.quant}.gguf"
        subprocess.run(llmkit_export(run, args.quant, ours, extra), check=True, stdout=subprocess.DEVNULL)  # compiles the kernels once
        times = {"llmkit": [], "llama.cpp": [], "llmkit f16": []}  # f16: the same command, nothing quantised
        load = [os.getloadavg()[0]]
        for _ in range(args.runs):
            times["llmkit"].append(timed(llmkit_export(run, args.quant, ours, extra)))
            times["llama.cpp"].append(timed([sys.executable, "-c", LLAMA_CPP_QUANTIZE, str(f16 / "model-f16.gguf"),
                                              str(theirs), MIXES[args.quant][0]]))
            times["llmkit f16"].append(timed(llmkit_export(run, "f16", f16, [])))
        load.append(os.getloadavg()[0])
        n, differ = same_tensors(ours / f"model-{args.quant}.gguf", theirs)
    print(f"{args.quant} of {'a random smol-135m' if args.run is None else run}, {os.cpu_count()} cores, "
          f"load average {load[0]:.2f} before, {load[1]:.2f} after")
    for side, t in times.items():
        print(f"  {side:11s} runs {', '.join(f'{x:.2f}' for x in t)} s; median {statistics.median(t):.2f} s "
              f"[{min(t):.2f}-{max(t):.2f}]")
    print(f"  ratio llmkit / llama.cpp (medians): {statistics.median(times['llmkit']) / statistics.median(times['llama.cpp']):.2f}")
    print(f"  tensors: {n}, differing: {differ or 'none'}")
    kernel_seconds()


if __name__ == "__main__":
    main()
