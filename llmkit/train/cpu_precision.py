"""The precision a run trains in: `precision=bf16` on a CPU only where it multiplies bf16 in hardware.

On CPU, a bf16 run's products go through oneDNN, which multiplies bf16 matrices with AVX512-BF16's
dot products (`vdpbf16ps`) or AMX's tiles. On an AMD EPYC with avx512_bf16 and no AMX, 1 thread, a
144 x 576 by 576 x 1536 product (a SmolLM2 MLP's over a LoRA micro-batch's rows) takes 1.2 ms of CPU
in bf16 against 2.6 in fp32; with oneDNN held to the instructions of CPUs without them
(ONEDNN_MAX_CPU_ISA=AVX512_CORE or AVX2) it widens every bf16 operand to fp32 in software and
takes 6.9 and 104 ms: 2.6x and 40x fp32's time (bench/bf16_matmul.py,
bench/results/2026-12-07-bf16-train.md). So there a `precision=bf16` run
says so in one line, naming the missing flags, and trains in fp32; the run's manifest records the
precision it trained in (`stats.precision`). GPUs are left to DeepSpeed as they are.
`lora.base_products=bf16` is the lighter form for a LoRA run: the model stays fp32 and only the
frozen base's products go through bf16 copies (`base_products`, `llmkit.model.packed_linear`).
LLMKIT_CPU_BF16=0 acts as a CPU without the instructions (as LLMKIT_CPU_KERNELS=fp32 does for
decoding): the tests' fallback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo's names of the bf16 product instructions
FORCE_FP32 = "LLMKIT_CPU_BF16"  # "0": act as a CPU without them
_said: set[str] = set()


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's `flags` (x86 Linux), empty where the file or line is missing."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def missing_cpu_bf16(flags: frozenset[str] | None = None) -> str | None:
    """Why this CPU cannot multiply bf16 in hardware (the flags it lacks, or the variable forcing
    that), None when it can."""
    if os.environ.get(FORCE_FP32) == "0":
        return f"{FORCE_FP32}=0 is set"
    flags = cpu_flags() if flags is None else flags
    if any(flag in flags for flag in BF16_FLAGS):
        return None
    return f"this CPU lacks {' and '.join(BF16_FLAGS)}"


def trained_precision(requested: str, on_gpu: bool | None = None) -> str:
    """The precision a run asking for `requested` trains in: fp32 instead of bf16 on a CPU that
    lacks the bf16 instructions (said once per process on stderr), else `requested`. `on_gpu`:
    whether the run computes on a GPU (default: whether torch sees one, as the engine decides)."""
    if requested != "bf16":
        return requested
    if on_gpu is None:
        import torch

        on_gpu = torch.cuda.is_available()
    why = None if on_gpu else missing_cpu_bf16()
    if why is None:
        return requested
    _say_once(f"llmkit: precision=bf16: {why}, which a CPU needs to multiply bf16 faster than fp32; "
              "training in fp32")
    return "fp32"


def base_products(requested: str, on_gpu: bool) -> str:
    """The dtype a LoRA run's frozen base multiplies in (`lora.base_products`): bf16 only on a CPU
    with the bf16 instructions (the copies are CPU packing's), else fp32, said once."""
    if requested != "bf16":
        return requested
    why = "a GPU run multiplies in its precision (set precision=bf16 there)" if on_gpu else missing_cpu_bf16()
    if why is None:
        return requested
    _say_once(f"llmkit: lora.base_products=bf16: {why}; the base multiplies in fp32")
    return "fp32"


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr)
