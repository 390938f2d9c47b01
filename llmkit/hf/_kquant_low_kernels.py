"""The compiled kernels of llmkit.hf.gguf_kquants for ggml's 3- and 2-bit K-quants, Q3_K and Q2_K (numba), each in
its reference form (no importance matrix) and its weighted form (`quant_weights`, an importance matrix's column
weights), as llama.cpp's ggml-quants.c computes them, to the bit. They call the scale searches and roundings of
llmkit.hf._kquant_kernels, compiled in with them (llmkit.core.aot), and keep its rules: every float a float32,
every sum in C's order, an int meeting a float cast with F() first.

Both types cut a 256-value block into 16 sub-blocks of 16 values. Q3_K stores each sub-block's signed scale on a
6-bit grid of the block's d and each value on -4..3 (two low bits, one high bit); Q2_K stores each sub-block's
scale and min on 4-bit grids of d and dmin and each value on 0..3. Each kernel takes the rows of one tensor
(float32, C order), the column weights (float32; empty for none) and the output rows (uint8) and returns 0."""

import numpy as np
from numba import njit

from llmkit.hf._kquant_kernels import (GROUP_MAX_EPS, QK_K, clamped_level, fdiv, make_qkx_quants, make_qp_quants,
                                       make_qx_quants, nearest_int, store_fp16)

F = np.float32
Q3_K_BYTES, Q2_K_BYTES = 110, 84


@njit(cache=True, nogil=True, error_model="numpy")
def make_q3_quants(n, nmax, x, L, T):
    """make_q3_quants with do_rmse (quantize_row_q3_K_ref's sub-block scale): x on [-nmax, nmax - 1] at the scale
    nmax / max, then each level moved alone, five passes at most, where that raises the x*x-weighted fit; L gets
    the levels + nmax. T: float32 scratch, the levels while they move."""
    mx = amax = F(0.0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        L[:n] = 0
        return F(0.0)
    iscale = fdiv(F(-nmax), mx)
    sumlx = suml2 = F(0.0)
    for i in range(n):
        T[i] = clamped_level(iscale * x[i], -nmax, nmax - 1)
        w = x[i] * x[i]
        sumlx += w * x[i] * T[i]
        suml2 += w * T[i] * T[i]
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = x[i] * x[i]
            slx = sumlx - w * x[i] * T[i]
            if slx > 0:
                sl2 = suml2 - w * T[i] * T[i]
                new_l = clamped_level(fdiv(x[i] * sl2, slx), -nmax, nmax - 1)
                if new_l != T[i]:
                    slx += w * x[i] * new_l
                    sl2 += w * new_l * new_l
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        T[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if not changed:
            break
    for i in range(n):
        L[i] = nmax + int(T[i])
    return sumlx / suml2 if suml2 > 0 else F(0.0)


@njit(cache=True, nogil=True, error_model="numpy")
def q3_reference_scales(xb, L, Ls, scales, T):
    """quantize_row_q3_K_ref's scales: each sub-block's by make_q3_quants, on the signed 6-bit grid of the one
    largest in magnitude (Ls: the grid's levels + 32). Returns the block's d before its f16 rounding."""
    max_scale = amax = F(0.0)
    for j in range(16):
        scales[j] = make_q3_quants(16, 4, xb[16 * j:16 * j + 16], L[16 * j:16 * j + 16], T)
        if abs(scales[j]) > amax:
            amax = abs(scales[j])
            max_scale = scales[j]
    Ls[:] = 0  # no scale: the packed scales stay zero bytes (-32 each, times a zero d)
    if max_scale == 0:
        return F(0.0)
    iscale = fdiv(F(-32.0), max_scale)
    for j in range(16):
        level = ((nearest_int(iscale * scales[j]) + 128) & 0xFF) - 128  # ggml keeps it in an int8_t
        Ls[j] = max(-32, min(31, level)) + 32
    return fdiv(F(1.0), iscale)


@njit(cache=True, nogil=True, error_model="numpy")
def q3_weighted_scales(xb, qw, L, Ls, scales, weight, sw, W, T):
    """quantize_row_q3_K_impl's scales: each sub-block's by make_qx_quants weighted by qw times the block's
    spread, then the 16 scales' own grid by make_qx_quants weighted by their sub-blocks' weights."""
    sum_x2 = F(0.0)
    for l in range(QK_K):
        sum_x2 += xb[l] * xb[l]
    sigma2 = F(2.0) * sum_x2 / F(QK_K)
    for j in range(16):
        sumw = F(0.0)
        for l in range(16):
            weight[l] = qw[16 * j + l] * np.sqrt(sigma2 + xb[16 * j + l] * xb[16 * j + l])
            sumw += weight[l]
        sw[j] = sumw
        scales[j] = make_qx_quants(16, 4, xb[16 * j:16 * j + 16], L[16 * j:16 * j + 16], weight, W, T)
    return make_qx_quants(16, 32, scales, Ls, sw, W, T)


@njit(cache=True, nogil=True, error_model="numpy")
def quantize_q3_k(x, qw, out):
    """Rows of Q3_K blocks (110 bytes: 32 of high bits, 64 of low bit pairs, 12 of 6-bit scales, d)."""
    L, Ls = np.zeros(QK_K, np.uint8), np.zeros(16, np.uint8)
    scales, weight, sw = np.zeros(16, F), np.zeros(16, F), np.zeros(16, F)
    W, T = np.zeros(16, F), np.zeros(16, F)
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // QK_K):
            xb = x[r, QK_K * b:QK_K * (b + 1)]
            o = out[r, Q3_K_BYTES * b:Q3_K_BYTES * (b + 1)]
            if qw.size == 0:
                d_block = q3_reference_scales(xb, L, Ls, scales, T)
            else:
                d_block = q3_weighted_scales(xb, qw[QK_K * b:QK_K * (b + 1)], L, Ls, scales, weight, sw, W, T)
            o[96:108] = 0
            for j in range(16):  # low nibbles: 0..7 in bytes 0..7, 8..15 their high halves; high bit pairs 8..11
                if j < 8:
                    o[96 + j] = Ls[j] & 0xF
                else:
                    o[96 + j - 8] |= (Ls[j] & 0xF) << 4
                o[104 + j % 4] |= (Ls[j] >> 4) << (2 * (j // 4))
            d = store_fp16(o, 108, d_block)
            for j in range(16):
                dj = d * F(int(Ls[j]) - 32)
                if dj == 0:  # the sub-block keeps its scale search's levels
                    continue
                for ii in range(16):
                    L[16 * j + ii] = max(-4, min(3, nearest_int(fdiv(xb[16 * j + ii], dj)))) + 4
            o[0:32] = 0
            for j in range(QK_K):  # the high bit of value j: bit j // 32 of byte j % 32
                if L[j] > 3:
                    o[j % 32] |= 1 << (j // 32)
                    L[j] -= 4
            pack_bit_pairs(L, o[32:96])
    return 0


@njit(cache=True, nogil=True, error_model="numpy")
def pack_bit_pairs(L, qs):
    """ggml's 2-bit layout: byte l of each 32-byte half holds values l, l + 32, l + 64, l + 96 of its 128."""
    for j in range(0, QK_K, 128):
        for l in range(32):
            qs[j // 4 + l] = L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6)


@njit(cache=True, nogil=True, error_model="numpy")
def q2_reference_scales(xb, o, L, Laux, weights, scales, mins):
    """quantize_row_q2_K_ref's scales: each sub-block's scale and min by make_qkx2_quants (weights |x|, absolute
    error), on 4-bit grids of the largest; their bytes into o[0:16]. Returns (d, dmin) before f16 rounding."""
    max_scale = max_min = F(0.0)
    for j in range(16):
        xs = xb[16 * j:16 * j + 16]
        for l in range(16):
            weights[l] = abs(xs[l])
        scales[j], mins[j] = make_qkx_quants(16, 3, xs, weights, L[16 * j:16 * j + 16], Laux, F(-0.5), F(0.1), 15,
                                             False, True)
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    o[0:16] = 0
    if max_scale > 0:
        iscale = fdiv(F(15.0), max_scale)
        for j in range(16):
            o[j] = nearest_int(iscale * scales[j]) & 0xFF
    if max_min > 0:
        iscale = fdiv(F(15.0), max_min)
        for j in range(16):
            o[j] = (o[j] | (nearest_int(iscale * mins[j]) << 4)) & 0xFF
    return (max_scale / F(15.0) if max_scale > 0 else F(0.0)), (max_min / F(15.0) if max_min > 0 else F(0.0))


@njit(cache=True, nogil=True, error_model="numpy")
def q2_weighted_scales(xb, qw, o, L, Laux, weights, scales, mins, sw, Ls, Lm):
    """quantize_row_q2_K_impl's scales: each sub-block's scale and min by make_qkx3_quants weighted by qw times
    the block's spread, their grids by make_qp_quants; their bytes into o[0:16]. Returns (d, dmin)."""
    sum_x2 = F(0.0)
    for l in range(QK_K):
        sum_x2 += xb[l] * xb[l]
    sigma2 = sum_x2 / F(QK_K)
    for j in range(16):
        xs = xb[16 * j:16 * j + 16]
        sumw = F(0.0)
        for l in range(16):
            weights[l] = qw[16 * j + l] * np.sqrt(sigma2 + xs[l] * xs[l])
            sumw += weights[l]
        sw[j] = sumw
        scales[j], mins[j] = make_qkx_quants(16, 3, xs, weights, L[16 * j:16 * j + 16], Laux, F(-0.9), F(0.05), 36,
                                             True)
    dm = make_qp_quants(16, 15, scales, Ls, sw)
    mm = make_qp_quants(16, 15, mins, Lm, sw)
    for j in range(16):
        o[j] = (Ls[j] | (Lm[j] << 4)) & 0xFF
    return dm, mm


@njit(cache=True, nogil=True, error_model="numpy")
def quantize_q2_k(x, qw, out):
    """Rows of Q2_K blocks (84 bytes: 16 of 4-bit scale and min pairs, 64 of bit pairs, d, dmin)."""
    L, Ls, Lm = np.zeros(QK_K, np.uint8), np.zeros(16, np.uint8), np.zeros(16, np.uint8)
    Laux, weights = np.zeros(16, F), np.zeros(16, F)
    scales, mins, sw = np.zeros(16, F), np.zeros(16, F), np.zeros(16, F)
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // QK_K):
            xb = x[r, QK_K * b:QK_K * (b + 1)]
            o = out[r, Q2_K_BYTES * b:Q2_K_BYTES * (b + 1)]
            if qw.size == 0:
                d_block, m_block = q2_reference_scales(xb, o, L, Laux, weights, scales, mins)
            else:
                d_block, m_block = q2_weighted_scales(xb, qw[QK_K * b:QK_K * (b + 1)], o, L, Laux, weights, scales,
                                                      mins, sw, Ls, Lm)
            d, dmin = store_fp16(o, 80, d_block), store_fp16(o, 82, m_block)
            for j in range(16):
                dj = d * F(o[j] & 0xF)
                if dj == 0:  # the sub-block keeps its scale search's levels
                    continue
                dm = dmin * F(o[j] >> 4)
                for ii in range(16):
                    L[16 * j + ii] = max(0, min(3, nearest_int(fdiv(xb[16 * j + ii] + dm, dj))))
            pack_bit_pairs(L, o[16:80])
    return 0
