"""bf16 against fp32 products on this CPU, and on the same CPU held to older instructions.

Why `precision=bf16` trains on a CPU only where it has bf16 products in hardware
(`llmkit/train/cpu_precision.py`, issue 55): torch multiplies bf16 matrices on CPU through oneDNN,
which uses AVX512-BF16's `vdpbf16ps` or AMX tiles where the CPU has them and otherwise widens every
operand to fp32 in software. `ONEDNN_MAX_CPU_ISA` holds oneDNN to an older instruction set, so one
machine shows both: each setting runs in its own process (oneDNN reads the variable once).

The shapes are a SmolLM2-135M MLP's (576 -> 1536) forward product over the rows of a LoRA step's
micro-batch (`--rows`), and its input gradient (1536 -> 576). CPU seconds of one thread, the median
of `--reps` timings of `--iters` products each.

    python bench/bf16_matmul.py [--rows 144 2048] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # not bench/, whose tokenize.py shadows the standard library's

ISAS = ["DEFAULT", "AVX512_CORE", "AVX2"]  # this CPU; AVX-512 without BF16; AVX2


def measure(rows: int, iters: int, reps: int) -> dict:
    import time

    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    shapes = {"forward": (rows, 576, 1536), "input grad": (rows, 1536, 576)}
    out = {}
    for name, (m, k, n) in shapes.items():
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            for _ in range(3):
                a @ b
            times = []
            for _ in range(reps):
                start = time.process_time()
                for _ in range(iters):
                    a @ b
                times.append((time.process_time() - start) / iters * 1e3)
            out[f"{name} {str(dtype).removeprefix('torch.')}"] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[144, 2048])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        print(json.dumps({rows: measure(rows, a.iters, a.reps) for rows in a.rows}))
        return
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    print(f"CPU bf16 flags: {[f for f in ('avx512_bf16', 'amx_bf16') if f in flags] or 'none'}; "
          f"load average {os.getloadavg()[0]:.2f}; ms of CPU per product, 1 thread, median of {a.reps}")
    for isa in ISAS:
        env = {**os.environ, "ONEDNN_MAX_CPU_ISA": isa, "OMP_NUM_THREADS": "1"}
        args = [sys.executable, __file__, "--child", "--iters", str(a.iters), "--reps", str(a.reps), "--rows",
                *map(str, a.rows)]
        result = json.loads(subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout)
        for rows, timings in result.items():
            for shape in ("forward", "input grad"):
                fp32, bf16 = timings[f"{shape} float32"], timings[f"{shape} bfloat16"]
                print(f"  ONEDNN_MAX_CPU_ISA={isa:<12} rows {rows:>5} {shape:<10}: fp32 {fp32:7.2f}  bf16 {bf16:7.2f}"
                      f"  bf16/fp32 time {bf16 / fp32:.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
