"""GGML block quantisation of one tensor, byte for byte as llama.cpp's `ggml_quantize_chunk`: the
K-quants Q4_K, Q5_K, Q6_K and the weighted forms of the 32-value Q5_0 / Q5_1 they fall back to run
in numba kernels (llmkit.hf._kquant_kernels, compiled ahead of time: llmkit.core.aot); the
reference Q5_0 / Q5_1 are numpy here (each value alone: no sum whose order could differ); Q8_0
through the gguf package, whose Q8_0 is llama.cpp's. (gguf's Q4_0 / Q4_1 / Q5_x differ from
llama.cpp's in blocks of zeros, so they are not used for the fallbacks.)

With column weights (an importance matrix's row for the tensor) the K-quants and Q5_x take
ggml's weighted path (`quantize_row_*_impl`); without, its reference path (`*_ref`), exactly as
`ggml_quantize_chunk` chooses. Rows are cut into chunks that threads quantise at once (the
kernels release the GIL); blocks never straddle rows, so the bytes do not depend on the cut.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from llmkit.core import aot

KERNEL_TYPES = {  # GGML type -> (values per block, bytes per block, kernel, its last argument or None)
    "Q4_K": (256, 144, "affine_k_rows", 15),
    "Q5_K": (256, 176, "affine_k_rows", 31),
    "Q6_K": (256, 210, "quantize_q6_k", None),
    "Q5_0": (32, 22, "q5_rows", 0),
    "Q5_1": (32, 24, "q5_rows", 1),
}
SIGNATURES = {"affine_k_rows": "i8(f4[:, ::1], f4[::1], u1[:, ::1], i8)",
              "quantize_q6_k": "i8(f4[:, ::1], f4[::1], u1[:, ::1])",
              "q5_rows": "i8(f4[:, ::1], f4[::1], u1[:, ::1], i8)"}
ROWS_PER_CHUNK = 64  # small enough that two threads share a 576-row matrix, large enough to amortise a call

_KERNELS = None


def kernels():
    """The kernel module: compiled ahead of time where that can be had, else numba's JIT."""
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = aot.load("llmkit.hf._kquant_kernels", SIGNATURES, what="the GGUF K-quant kernels")
    return _KERNELS


def row_bytes(qtype: str, n_per_row: int) -> int:
    block, size, _, _ = KERNEL_TYPES[qtype]
    return n_per_row // block * size


def quantize(array, qtype: str, weights=None, threads: int | None = None):
    """The GGML bytes of `array` (float32, rows x n_per_row; n_per_row a multiple of the type's
    block) as uint8 rows; `weights` (float32, n_per_row) are an importance matrix's column
    weights, or None."""
    import numpy as np

    x = np.ascontiguousarray(array, dtype=np.float32).reshape(-1, array.shape[-1])
    if qtype == "Q8_0":  # ggml's Q8_0 takes no importance matrix
        import gguf

        data = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
        return data.reshape(*array.shape[:-1], data.shape[-1])
    block, _, name, argument = KERNEL_TYPES[qtype]
    if x.shape[1] % block:
        raise ValueError(f"rows of {x.shape[1]} values are not a multiple of {qtype}'s block of {block}")
    if weights is None and qtype in ("Q5_0", "Q5_1"):
        return reference_q5(x, qtype == "Q5_1").reshape(*array.shape[:-1], -1)
    compiled = getattr(kernels(), name)
    kernel = compiled if argument is None else lambda x, qw, out: compiled(x, qw, out, argument)
    qw = np.zeros(0, np.float32) if weights is None else np.ascontiguousarray(weights, dtype=np.float32)
    if qw.size not in (0, x.shape[1]):
        raise ValueError(f"{qw.size} column weights for rows of {x.shape[1]} values")
    out = np.zeros((x.shape[0], row_bytes(qtype, x.shape[1])), np.uint8)
    starts = range(0, x.shape[0], ROWS_PER_CHUNK)
    threads = min(threads or os.cpu_count() or 1, len(starts))
    if threads <= 1:
        kernel(x, qw, out)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda s: kernel(x[s:s + ROWS_PER_CHUNK], qw, out[s:s + ROWS_PER_CHUNK]), starts))
    return out.reshape(*array.shape[:-1], out.shape[-1])


def reference_q5(x, affine: bool):
    """quantize_row_q5_0_ref (affine False: d = -max|x| / 16, levels trunc(x/d + 16.5)) and
    quantize_row_q5_1_ref (True: d = (max - min) / 31, m = min, levels trunc((x - m)/d + 0.5)),
    in float32 as ggml computes them, as uint8 rows of 22 / 24-byte blocks."""
    import numpy as np

    blocks = x.reshape(-1, 32)
    f32 = np.float32
    with np.errstate(divide="ignore", invalid="ignore"):
        if affine:
            rows = np.arange(len(blocks))  # the first least / greatest value, as ggml's strict < and >, -0.0 kept
            low, high = blocks[rows, blocks.argmin(axis=1)], blocks[rows, blocks.argmax(axis=1)]
            d = (high - low) / f32(31)
            inv = np.where(d != 0, f32(1) / d, f32(0)).astype(f32)
            levels = ((blocks - low[:, None]) * inv[:, None] + f32(0.5)).astype(np.int32) & 0xFF
            head = [d.astype(np.float16).view(np.uint8).reshape(-1, 2), low.astype(np.float16).view(np.uint8).reshape(-1, 2)]
        else:
            largest = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)]  # the first largest |x|
            d = np.where(largest != 0, largest, f32(0)) / f32(-16)  # a block of zeros: ggml's max stays +0.0
            inv = np.where(d != 0, f32(1) / d, f32(0)).astype(f32)
            levels = np.minimum(31, (blocks * inv[:, None] + f32(16.5)).astype(np.int32))
            head = [d.astype(np.float16).view(np.uint8).reshape(-1, 2)]
    levels = levels.astype(np.uint32)
    high_bits = (((levels[:, :16] >> 4) & 1) << np.arange(16, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    high_bits |= (((levels[:, 16:] >> 4) & 1) << np.arange(16, 32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    nibbles = ((levels[:, :16] & 0xF) | ((levels[:, 16:] & 0xF) << 4)).astype(np.uint8)
    out = np.concatenate([*head, high_bits.astype("<u4").view(np.uint8).reshape(-1, 4), nibbles], axis=1)
    return out.reshape(x.shape[0], -1)
