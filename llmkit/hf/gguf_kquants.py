"""GGML block quantisation of one tensor, byte for byte as llama.cpp's `ggml_quantize_chunk`, in numba
kernels compiled ahead of time (llmkit.core.aot): the K-quants Q4_K, Q5_K, Q6_K and the weighted
forms of the 32-value Q4_0 / Q5_0 / Q5_1 they fall back to (llmkit.hf._kquant_kernels), Q3_K and
Q2_K (llmkit.hf._kquant_low_kernels), the reference forms of Q4_0, Q5_0, Q5_1 and Q8_0
(llmkit.hf._block32_kernels). (The gguf package's Q5_x differ from llama.cpp's in blocks of zeros
and -0.0, so they are not used.)

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
    "Q2_K": (256, 84, "quantize_q2_k", None),
    "Q3_K": (256, 110, "quantize_q3_k", None),
    "Q4_K": (256, 144, "affine_k_rows", 15),
    "Q5_K": (256, 176, "affine_k_rows", 31),
    "Q6_K": (256, 210, "quantize_q6_k", None),
    "Q4_0": (32, 18, "block32_weighted_rows", 2),
    "Q5_0": (32, 22, "block32_weighted_rows", 0),
    "Q5_1": (32, 24, "block32_weighted_rows", 1),
}
SIGNATURES = {"affine_k_rows": "i8(f4[:, ::1], f4[::1], u1[:, ::1], i8)",
              "quantize_q6_k": "i8(f4[:, ::1], f4[::1], u1[:, ::1])",
              "block32_weighted_rows": "i8(f4[:, ::1], f4[::1], u1[:, ::1], i8)"}
LOW_SIGNATURES = {"quantize_q3_k": "i8(f4[:, ::1], f4[::1], u1[:, ::1])",
                  "quantize_q2_k": "i8(f4[:, ::1], f4[::1], u1[:, ::1])"}
ROWS_PER_CHUNK = 64  # small enough that two threads share a 576-row matrix, large enough to amortise a call

BLOCK32 = {"Q5_0": (22, 0), "Q5_1": (24, 1), "Q8_0": (34, 2), "Q4_0": (18, 3)}  # reference forms: bytes a block, kind
BLOCK32_SIGNATURE = {"block32_rows": "i8(f4[:, ::1], u1[:, ::1], f4[::1], f4[::1], i8)"}
MODULE_SIGNATURES = {"_kquant_kernels": SIGNATURES, "_kquant_low_kernels": LOW_SIGNATURES,
                     "_block32_kernels": BLOCK32_SIGNATURE,
                     "_f16_kernels": {"f16_rounded_rows": "i8(f4[:, ::1], f4[:, ::1])"}}

_KERNELS = {}


def kernels(module: str = "_kquant_kernels"):
    """A kernel module: compiled ahead of time where that can be had, else numba's JIT."""
    if module not in _KERNELS:
        _KERNELS[module] = aot.load(f"llmkit.hf.{module}", MODULE_SIGNATURES[module],
                                    what=f"the GGUF quantisers ({module})")
    return _KERNELS[module]


def f16_rounded(array):
    """float32 `array` rounded to float16 and back (numpy's two casts, bit for bit), in the kernel."""
    import numpy as np

    x = np.ascontiguousarray(array, dtype=np.float32)
    flat = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    out = np.empty_like(flat)
    kernels("_f16_kernels").f16_rounded_rows(flat, out)
    return out.reshape(x.shape)


def row_bytes(qtype: str, n_per_row: int) -> int:
    block, size, _, _ = KERNEL_TYPES[qtype]
    return n_per_row // block * size


def quantize(array, qtype: str, weights=None, threads: int | None = None):
    """The GGML bytes of `array` (float32, rows x n_per_row; n_per_row a multiple of the type's
    block) as uint8 rows; `weights` (float32, n_per_row) are an importance matrix's column
    weights, or None (Q8_0 takes none: ggml ignores them)."""
    import numpy as np

    x = np.ascontiguousarray(array, dtype=np.float32).reshape(-1, array.shape[-1])
    if qtype == "Q8_0" or (weights is None and qtype in BLOCK32):
        return reference_block32(x, qtype, threads).reshape(*array.shape[:-1], -1)
    block, _, name, argument = KERNEL_TYPES[qtype]
    if x.shape[1] % block:
        raise ValueError(f"rows of {x.shape[1]} values are not a multiple of {qtype}'s block of {block}")
    compiled = getattr(kernels("_kquant_low_kernels" if name in LOW_SIGNATURES else "_kquant_kernels"), name)
    qw = np.zeros(0, np.float32) if weights is None else np.ascontiguousarray(weights, dtype=np.float32)
    if qw.size not in (0, x.shape[1]):
        raise ValueError(f"{qw.size} column weights for rows of {x.shape[1]} values")
    out = np.zeros((x.shape[0], row_bytes(qtype, x.shape[1])), np.uint8)
    if argument is None:
        in_chunks(lambda a, b: compiled(x[a:b], qw, out[a:b]), x.shape[0], threads)
    else:
        in_chunks(lambda a, b: compiled(x[a:b], qw, out[a:b], argument), x.shape[0], threads)
    return out.reshape(*array.shape[:-1], out.shape[-1])


def reference_block32(x, qtype: str, threads: int | None):
    """quantize_row_q5_0_ref / q5_1_ref / q8_0_ref: the kernel fills the levels and returns each
    block's float32 d (and m); numpy's float16 rounds them as GGML_FP32_TO_FP16 does."""
    import numpy as np

    size, kind = BLOCK32[qtype]
    if x.shape[1] % 32:
        raise ValueError(f"rows of {x.shape[1]} values are not a multiple of {qtype}'s block of 32")
    per_row = x.shape[1] // 32
    out = np.zeros((x.shape[0], per_row * size), np.uint8)
    d, m = np.zeros(x.shape[0] * per_row, np.float32), np.zeros(x.shape[0] * per_row, np.float32)
    compiled = kernels("_block32_kernels").block32_rows
    in_chunks(lambda a, b: compiled(x[a:b], out[a:b], d[a * per_row:b * per_row], m[a * per_row:b * per_row], kind),
              x.shape[0], threads)
    blocks = out.reshape(-1, size)
    blocks[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    if kind == 1:
        blocks[:, 2:4] = m.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return out


def in_chunks(work, rows: int, threads: int | None) -> None:
    """work(start, stop) over chunks of rows, on `threads` threads (default: every core)."""
    starts = range(0, rows, ROWS_PER_CHUNK)
    threads = min(threads or os.cpu_count() or 1, len(starts))
    if threads <= 1:
        work(0, rows)
        return
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda a: work(a, min(a + ROWS_PER_CHUNK, rows)), starts))
