"""The compiled kernels of llmkit.hf.gguf_kquants for the reference forms of ggml's 32-value blocks
a K-quant file falls back to: quantize_row_q5_0_ref, quantize_row_q5_1_ref, quantize_row_q8_0_ref,
quantize_row_q4_0_ref
(numba; compiled ahead of time, see llmkit.core.aot). Each value is rounded alone from float32
scales, as ggml computes them; the kernel fills every byte but the halves (d, and m for Q5_1),
which it returns as float32 for the caller to store (numpy's float16 rounds as ggml's does).
"""

import math

import numpy as np
from numba import njit

F = np.float32


@njit(cache=True, nogil=True, error_model="numpy")
def block32_rows(x, out, d, m, kind):
    """Rows x (float32) -> out (uint8 rows of blocks) for kind 0 (Q5_0: 22 bytes a block: d, 4 bytes
    of fifth bits, 16 of nibbles), 1 (Q5_1: 24 bytes: d, m, then the same), 2 (Q8_0: 34 bytes:
    d, 32 int8) or 3 (Q4_0: 18 bytes: d, 16 of nibbles); d[k], m[k] get block k's scale and minimum
    (rows first)."""
    L = np.zeros(32, np.int64)
    size = (22, 24, 34, 18)[kind]
    k = 0
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            xb = x[r, 32 * b:32 * (b + 1)]
            o = out[r, size * b:size * (b + 1)]
            if kind == 1:
                lo = F(np.inf)
                hi = F(-np.inf)
                for j in range(32):
                    lo = xb[j] if xb[j] < lo else lo
                    hi = xb[j] if xb[j] > hi else hi
                scale = (hi - lo) / F(31.0)
                inv = F(1.0) / scale if scale != 0 else F(0.0)
                for j in range(32):
                    L[j] = int((xb[j] - lo) * inv + F(0.5)) & 0xFF
                m[k] = lo
            else:
                amax = F(0.0)
                mx = F(0.0)
                for j in range(32):
                    if amax < abs(xb[j]):
                        amax = abs(xb[j])
                        mx = xb[j]
                scale = mx / F(-16.0) if kind == 0 else mx / F(-8.0) if kind == 3 else amax / F(127.0)
                inv = F(1.0) / scale if scale != 0 else F(0.0)
                for j in range(32):
                    v = xb[j] * inv
                    if kind == 0:
                        L[j] = min(31, int(v + F(16.5)))
                    elif kind == 3:
                        L[j] = min(15, int(v + F(8.5)))
                    else:  # roundf: half away from zero
                        t = math.floor(abs(v))
                        t += 1 if abs(v) - F(t) >= F(0.5) else 0
                        o[2 + j] = (-t if v < 0 else t) & 0xFF
            d[k] = scale
            k += 1
            if kind == 2:
                continue
            if kind == 3:
                for j in range(16):
                    o[2 + j] = L[j] | (L[j + 16] << 4)
                continue
            at = size - 20
            qh = 0
            for j in range(16):
                o[at + 4 + j] = (L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4)
                qh |= ((L[j] >> 4) & 1) << j
                qh |= ((L[j + 16] >> 4) & 1) << (j + 16)
            for i in range(4):
                o[at + i] = (qh >> (8 * i)) & 0xFF
    return 0
