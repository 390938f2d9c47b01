"""The compiled kernel of llmkit.hf.gguf_kquants.f16_rounded (numba, compiled ahead of time as the
block quantisers are): a K-quant mix quantises the values llama.cpp's quantiser reads from the f16
file, so each tensor is first rounded to float16 and back; numpy's two casts took 1.3 s of a 135M
model's export, these integer operations a tenth of it."""

import numpy as np
from numba import njit

F = np.float32



@njit(cache=True, nogil=True, error_model="numpy")
def f16_rounded_rows(x, out):
    """out = x rounded to float16 and widened back, as numpy's astype(float16).astype(float32)
    (to nearest, ties to even; NaN keeping its top payload bits, quiet): the values llama.cpp's
    quantiser reads from the f16 file, by integer operations, many times numpy's cast's speed."""
    for r in range(x.shape[0]):
        xb = x[r].view(np.uint32)
        ob = out[r].view(np.uint32)
        for i in range(xb.size):
            u = xb[i]
            a = u & np.uint32(0x7FFFFFFF)
            sign = u & np.uint32(0x80000000)
            if a >= np.uint32(0x7F800000):  # inf, NaN (a NaN whose payload the half loses gets payload 1)
                m = (a & np.uint32(0x7FFFFF)) >> np.uint32(13)
                if a > np.uint32(0x7F800000) and m == 0:
                    m = np.uint32(1)
                ob[i] = sign | np.uint32(0x7F800000) | (m << np.uint32(13))
            elif a >= np.uint32(0x477FF000):  # 65520 and above: beyond the largest half
                ob[i] = sign | np.uint32(0x7F800000)
            elif a >= np.uint32(0x38800000):  # a normal half: keep 10 mantissa bits, to nearest even
                ob[i] = sign | ((a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000))
            else:  # a subnormal half: a multiple of 2**-24 (both products exact)
                out[r, i] = F(np.rint(abs(x[r, i]) * F(16777216.0)) * F(5.9604644775390625e-08))
                if sign:
                    out[r, i] = -out[r, i]
    return 0
