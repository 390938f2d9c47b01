"""The compiled kernels of llmkit.hf.gguf_kquants (numba): ggml's block quantisers Q4_K, Q5_K, Q6_K and the
32-value Q4_0 / Q5_0 / Q5_1 that llama.cpp falls back to, each in its two forms — the reference form (no importance
matrix) and the weighted form (`quant_weights`, an importance matrix's column weights) — as llama.cpp's
ggml-quants.c computes them, to the bit.

Every float is a float32 and every sum runs in C's order (ggml-base is built without FMA and without
fast-math: no contraction, no reordering), so that the bytes equal llama.cpp's; an int meeting a float is
cast with F() first, as C converts it. Each kernel takes the rows of one tensor (float32, C order), the column
weights (float32; empty for none) and the output rows (uint8, the block bytes of one row each) and returns 0.
llmkit.hf.gguf_kquants loads them compiled ahead of time (see llmkit.core.aot) and says what each stores;
llmkit.hf._kquant_low_kernels (Q2_K, Q3_K) calls the scale searches here."""

import math

import numpy as np
from numba import njit

F = np.float32
QK_K = 256
GROUP_MAX_EPS = np.float32(1e-15)


@njit(cache=True, nogil=True, error_model="numpy")
def nearest_int(f):
    """ggml's nearest_int: f + 1.5 * 2**23 rounds to the nearest even integer; its mantissa is it."""
    if abs(f) <= F(4194303.0):  # the addition rounds, as in ggml (np.rint is a libm call on a generic CPU)
        return int(F(F(f + F(12582912.0)) - F(12582912.0)))
    v = F(f + F(12582912.0))  # beyond what ggml asserts: its bits, read as ggml reads them
    if math.isnan(v) or math.isinf(v):
        return 0 if math.isnan(v) else -0x400000
    m, _ = math.frexp(abs(np.float64(v)))  # |v| >= 2**21: a normal float, 23 bits after the point
    return (int((m * 2.0 - 1.0) * 8388608.0) & 0x7FFFFF) - 0x400000


@njit(cache=True, nogil=True, error_model="numpy")
def clamped_level(v, lo, hi):
    """max(lo, min(hi, nearest_int(v))) as a float32, in floats where ggml's rounding trick holds."""
    if abs(v) <= F(4194303.0):
        r = F(F(v + F(12582912.0)) - F(12582912.0))
        return max(F(lo), min(F(hi), r))
    return F(max(lo, min(hi, nearest_int(v))))


@njit(cache=True, nogil=True, error_model="numpy")
def fdiv(a, b):
    """a / b as C divides floats: a zero divisor gives an infinity or (0/0) x86's negative NaN,
    never an exception (the kernels compiled ahead of time raise one on a plain `/`)."""
    if b == 0:
        if a == 0 or a != a:
            return F(-np.nan)
        return F(np.inf) if (a > 0) == (math.copysign(1.0, b) > 0) else F(-np.inf)
    return a / b


@njit(cache=True, nogil=True, error_model="numpy")
def fp16_bits(f):
    """GGML_FP32_TO_FP16: round to nearest even, as a uint16's bits."""
    x = np.float64(f)
    sign = 0x8000 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a != a:
        return sign | 0x7E00
    if a >= 65520.0:
        return sign | 0x7C00
    if a < 6.103515625e-05:  # below 2**-14: a subnormal half, in steps of 2**-24
        return sign | int(np.rint(a * 16777216.0))
    m, e = math.frexp(a)
    q = int(np.rint(m * 2048.0))
    if q == 2048:
        q = 1024
        e += 1
    if e + 14 >= 31:
        return sign | 0x7C00
    return sign | ((e + 14) << 10) | (q - 1024)


@njit(cache=True, nogil=True, error_model="numpy")
def store_fp16(out, at, f):
    """Store f as a half at out[at:at + 2] (little-endian); return the float the half holds."""
    bits = fp16_bits(f)
    out[at] = bits & 0xFF
    out[at + 1] = bits >> 8
    exponent, mantissa = (bits >> 10) & 31, bits & 1023
    v = mantissa * 2.0 ** -24 if exponent == 0 else (1024 + mantissa) * 2.0 ** (exponent - 25)
    return F(-v if bits & 0x8000 else v)


@njit(cache=True, nogil=True, error_model="numpy")
def make_qx_quants(n, nmax, x, L, qw, W, T):
    """make_qx_quants with rmse_type 1: the symmetric scale of x in [-nmax, nmax - 1] minimising
    the error weighted by qw (by x*x where qw is empty); L gets the levels + nmax. Scratch: W, the weights
    (once, not per trial), T a trial's levels (kept when it wins, where ggml recomputes the same)."""
    mx = amax = F(0.0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        L[:n] = 0
        return F(0.0)
    for i in range(n):
        W[i] = qw[i] if qw.size else x[i] * x[i]
    scale = best = F(0.0)
    for k in range(19):  # the scale nmax / max first, then nmax + 0.1 * step for step -9..-1, 1..9
        step = 0 if k == 0 else k - 10 if k <= 9 else k - 9
        iscale = fdiv(-(F(nmax) + F(0.1) * F(step)), mx)
        sumlx = suml2 = F(0.0)
        for i in range(n):
            l = clamped_level(iscale * x[i], -nmax, nmax - 1)
            T[i] = l
            sumlx += W[i] * x[i] * l
            suml2 += W[i] * l * l
        if k == 0 or (suml2 > 0 and sumlx * sumlx > best * suml2):
            for i in range(n):
                L[i] = nmax + int(T[i])
            scale = sumlx / suml2 if suml2 != 0 else F(0.0)
            best = scale * sumlx
    return scale


@njit(cache=True, nogil=True, error_model="numpy")
def make_qkx_quants(n, nmax, x, weights, L, Laux, rmin, rdelta, nstep, clamp_first, use_mad=False):
    """make_qkx2_quants (clamp_first False) and make_qkx3_quants (True, its guarded rounding of the trial
    levels): scale and min of x on 0..nmax, the weighted squared error (with use_mad, absolute error: Q2_K's
    reference form) least over nstep + 1 trial scales. Returns (scale, -min). Laux: float32 scratch."""
    mn = mx = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if mn > 0:
        mn = F(0.0)
    if mx <= mn:
        L[:n] = 0
        return F(0.0), -mn
    iscale = fdiv(F(nmax), mx - mn)
    scale = fdiv(F(1.0), iscale)
    best_error = F(0.0)
    for i in range(n):
        L[i] = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
        diff = scale * F(L[i]) + mn - x[i]
        best_error += weights[i] * (abs(diff) if use_mad else diff * diff)
    for step in range(nstep + 1):
        iscale = fdiv(rmin + rdelta * F(step) + F(nmax), mx - mn)
        sum_l = sum_l2 = sum_xl = F(0.0)
        for i in range(n):
            if clamp_first:
                v = iscale * (x[i] - mn)
                l = clamped_level(min(v, F(nmax)), 0, nmax) if v > 0 else F(0.0)
            else:
                l = clamped_level(iscale * (x[i] - mn), 0, nmax)
            Laux[i] = l
            w = weights[i]
            sum_l += w * l
            sum_l2 += w * l * l
            sum_xl += w * l * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = fdiv(sum_w * sum_xl - sum_x * sum_l, D)
            this_min = fdiv(sum_l2 * sum_x - sum_l * sum_xl, D)
            if this_min > 0:
                this_min = F(0.0)
                this_scale = fdiv(sum_xl, sum_l2)
            cur_error = F(0.0)
            for i in range(n):
                diff = this_scale * Laux[i] + this_min - x[i]
                cur_error += weights[i] * (abs(diff) if use_mad else diff * diff)
            if cur_error < best_error:
                for i in range(n):
                    L[i] = int(Laux[i])
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@njit(cache=True, nogil=True, error_model="numpy")
def make_qp_quants(n, nmax, x, L, quant_weights):
    """make_qp_quants: one scale for the non-negative x (sub-block scales or mins) on 0..nmax, weighted."""
    mx = F(0.0)
    for i in range(n):
        mx = mx if mx > x[i] else x[i]
    if mx < GROUP_MAX_EPS:
        L[:n] = 0
        return F(0.0)
    iscale = best_mse = F(0.0)
    for k in range(9):  # the scale nmax / max first, then (nmax + 0.1 * step) / max for step -4..-1, 1..4
        step = 0 if k == 0 else k - 5 if k <= 4 else k - 4
        iscale_is = fdiv(F(0.1) * F(step) + F(nmax), mx)
        scale_is = fdiv(F(1.0), iscale_is)
        mse = F(0.0)
        for i in range(n):
            diff = x[i] - scale_is * F(min(nmax, nearest_int(iscale_is * x[i])))
            mse += quant_weights[i] * diff * diff
        if k == 0 or mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = suml2 = F(0.0)
    for i in range(n):
        l = min(nmax, nearest_int(iscale * x[i]))
        L[i] = l
        w = quant_weights[i]
        sumlx += w * x[i] * F(l)
        suml2 += w * F(l) * F(l)
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = quant_weights[i]
            slx = sumlx - w * x[i] * F(L[i])
            sl2 = suml2 - w * F(L[i]) * F(L[i])
            if slx > 0 and sl2 > 0:
                new_l = min(nmax, nearest_int(fdiv(x[i] * sl2, slx)))
                if new_l != L[i]:
                    slx += w * x[i] * F(new_l)
                    sl2 += w * F(new_l) * F(new_l)
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if not changed:
            break
    return sumlx / suml2 if suml2 > 0 else F(0.0)


@njit(cache=True, nogil=True, error_model="numpy")
def affine_k_block(x, qw, out, nmax, L, Laux, weights, scales, mins, ls, lm, sw):
    """One 256-value block of Q4_K (nmax 15) or Q5_K (31): d, dmin and the 12 bytes of 6-bit sub-block scales
    and mins into out[0:16], the levels into L. qw: the block's column weights, or empty (reference form)."""
    if qw.size == 0:  # quantize_row_q{4,5}_K_ref
        rmin, nstep = (F(-1.0), 20) if nmax == 15 else (F(-0.5), 15)
        max_scale = max_min = F(0.0)
        for j in range(8):
            xs = x[32 * j:32 * j + 32]
            sum_x2 = F(0.0)
            for l in range(32):
                sum_x2 += xs[l] * xs[l]
            av_x = np.sqrt(sum_x2 / F(32.0))
            for l in range(32):
                weights[l] = av_x + abs(xs[l])
            scales[j], mins[j] = make_qkx_quants(32, nmax, xs, weights, L[32 * j:32 * j + 32], Laux,
                                                 rmin, F(0.1), nstep, False)
            if scales[j] > max_scale:
                max_scale = scales[j]
            if mins[j] > max_min:
                max_min = mins[j]
        inv_scale = fdiv(F(63.0), max_scale) if max_scale > 0 else F(0.0)
        inv_min = fdiv(F(63.0), max_min) if max_min > 0 else F(0.0)
        for j in range(8):
            ls[j] = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
            lm[j] = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        d_block, m_block = max_scale / F(63.0), max_min / F(63.0)
    else:  # quantize_row_q{4,5}_K_impl
        sum_x2 = F(0.0)
        for l in range(QK_K):
            sum_x2 += x[l] * x[l]
        sigma2 = F(2.0) * sum_x2 / F(QK_K)
        for j in range(8):
            xs = x[32 * j:32 * j + 32]
            sumw = F(0.0)
            for l in range(32):
                weights[l] = qw[32 * j + l] * np.sqrt(sigma2 + xs[l] * xs[l])
                sumw += weights[l]
            sw[j] = sumw
            scales[j], mins[j] = make_qkx_quants(32, nmax, xs, weights, L[32 * j:32 * j + 32], Laux,
                                                 F(-0.9), F(0.05), 36, True)
        d_block = make_qp_quants(8, 63, scales, ls, sw)
        m_block = make_qp_quants(8, 63, mins, lm, sw)
    s = out[4:16]
    s[:] = 0
    for j in range(8):  # 6-bit scales and mins: low 6 bits of 0..3 in bytes 0..7, the rest split
        if j < 4:
            s[j] = ls[j]
            s[j + 4] = lm[j]
        else:
            s[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4)
            s[j - 4] |= (ls[j] >> 4) << 6
            s[j] |= (lm[j] >> 4) << 6
    d, dmin = store_fp16(out, 0, d_block), store_fp16(out, 2, m_block)
    for j in range(8):
        if j < 4:
            sc, m = s[j] & 63, s[j + 4] & 63
        else:
            sc, m = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
        dj = d * F(sc)
        if dj == 0:
            continue
        dm = dmin * F(m)
        for ii in range(32):
            L[32 * j + ii] = max(0, min(nmax, nearest_int(fdiv(x[32 * j + ii] + dm, dj))))


@njit(cache=True, nogil=True, error_model="numpy")
def affine_k_rows(x, qw, out, nmax):
    """Rows of Q4_K (nmax 15; 144 bytes a block: d, dmin, 12 of scales, 128 of nibbles) or Q5_K (31; 176
    bytes: d, dmin, 12 of scales, 32 of fifth bits, 128 of nibbles)."""
    L = np.zeros(QK_K, np.uint8)
    Laux, weights = np.zeros(32, np.float32), np.zeros(32, np.float32)
    scales, mins, sw = np.zeros(8, np.float32), np.zeros(8, np.float32), np.zeros(8, np.float32)
    ls, lm = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    size = 144 if nmax == 15 else 176
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // QK_K):
            o = out[r, size * b:size * (b + 1)]
            w = qw[QK_K * b:QK_K * (b + 1)] if qw.size else qw
            affine_k_block(x[r, QK_K * b:QK_K * (b + 1)], w, o, nmax, L, Laux, weights, scales, mins, ls, lm, sw)
            nibbles = 16 if nmax == 15 else 48
            o[16:nibbles] = 0
            for n in range(0, QK_K, 64):
                for j in range(32):
                    l1 = L[n + j]
                    l2 = L[n + j + 32]
                    if nmax == 31:  # the fifth bits: pair n // 64 of each byte
                        o[16 + j] |= ((l1 >> 4) << (n // 32)) | ((l2 >> 4) << (n // 32 + 1))
                    o[nibbles + n // 2 + j] = (l1 & 0xF) | ((l2 & 0xF) << 4)
    return 0


@njit(cache=True, nogil=True, error_model="numpy")
def quantize_q6_k(x, qw, out):
    """Rows of Q6_K blocks (210 bytes: 128 of low nibbles, 64 of high bit pairs, 16 int8 scales, d)."""
    L = np.zeros(QK_K, np.uint8)
    W, T = np.zeros(16, np.float32), np.zeros(16, np.float32)
    scales = np.zeros(16, np.float32)
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // QK_K):
            xb = x[r, QK_K * b:QK_K * (b + 1)]
            o = out[r, 210 * b:210 * (b + 1)]
            max_scale = max_abs_scale = F(0.0)
            for ib in range(16):
                w = qw[QK_K * b + 16 * ib:QK_K * b + 16 * ib + 16] if qw.size else qw
                scales[ib] = make_qx_quants(16, 32, xb[16 * ib:16 * ib + 16], L[16 * ib:16 * ib + 16], w, W, T)
                if abs(scales[ib]) > max_abs_scale:
                    max_abs_scale = abs(scales[ib])
                    max_scale = scales[ib]
            if max_abs_scale < GROUP_MAX_EPS:
                o[:] = 0
                continue
            iscale = fdiv(F(-128.0), max_scale)
            d = store_fp16(o, 208, fdiv(F(1.0), iscale))
            for ib in range(16):
                o[192 + ib] = min(127, nearest_int(iscale * scales[ib])) & 0xFF
            for j in range(16):
                dj = d * F(o[192 + j] - 256 if o[192 + j] > 127 else o[192 + j])
                if dj == 0:
                    continue
                for ii in range(16):
                    L[16 * j + ii] = max(-32, min(31, nearest_int(fdiv(xb[16 * j + ii], dj)))) + 32
            for j in range(0, QK_K, 128):
                for l in range(32):
                    q1, q2, q3, q4 = L[j + l], L[j + l + 32], L[j + l + 64], L[j + l + 96]
                    o[j // 2 + l] = (q1 & 0xF) | ((q3 & 0xF) << 4)
                    o[j // 2 + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4)
                    o[128 + j // 4 + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
    return 0


@njit(cache=True, nogil=True, error_model="numpy")
def block32_weighted_rows(x, qw, out, kind):
    """Rows of Q5_0 (kind 0; 22 bytes a block: d, 4 bytes of fifth bits, 16 of nibbles), Q5_1 (1; 24 bytes: d, m,
    then the same) or Q4_0 (2; 18 bytes: d, 16 of nibbles), weighted by qw: quantize_row_q{5_0,5_1,4_0}_impl
    (reference forms: _block32_kernels)."""
    L = np.zeros(32, np.uint8)
    Laux = np.zeros(32, np.float32)
    weight, Taux = np.zeros(32, np.float32), np.zeros(32, np.float32)
    size = (22, 24, 18)[kind]
    for r in range(x.shape[0]):
        sum_x2 = F(0.0)  # the weighted forms scale by the whole row's mean square
        for j in range(x.shape[1]):
            sum_x2 += x[r, j] * x[r, j]
        sigma2 = sum_x2 / F(x.shape[1])
        for b in range(x.shape[1] // 32):
            xb = x[r, 32 * b:32 * (b + 1)]
            o = out[r, size * b:size * (b + 1)]
            for j in range(32):
                weight[j] = qw[32 * b + j] * np.sqrt(sigma2 + xb[j] * xb[j])
            if kind == 1:
                d, neg_min = make_qkx_quants(32, 31, xb, weight, L, Laux, F(-0.9), F(0.05), 36, True)
                store_fp16(o, 0, d)
                store_fp16(o, 2, -neg_min)
            else:
                store_fp16(o, 0, make_qx_quants(32, 16 if kind == 0 else 8, xb, L, weight, Laux, Taux))
            if kind == 2:
                for j in range(16):
                    o[2 + j] = L[j] | (L[j + 16] << 4)
                continue
            at = size - 20
            qh = 0
            for j in range(16):
                o[at + 4 + j] = (L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4)
                qh |= ((L[j] & 0x10) >> 4) << j
                qh |= ((L[j + 16] & 0x10) >> 4) << (j + 16)
            for k in range(4):
                o[at + k] = (qh >> (8 * k)) & 0xFF
    return 0

