"""The dedup kernels (llmkit.data.dedup._kernels: the sketches; _cluster_kernels: union-find),
compiled ahead of time on first use so that a dedup process never imports numba (see llmkit.core.aot),
else run through numba's JIT."""

from __future__ import annotations

from llmkit.core import aot

_KERNELS = _CLUSTER_KERNELS = None
SIGNATURES = {  # of the kernels compiled ahead of time: the arrays the dedup modules hand them
    "shingles": "Tuple((u8[::1], i8[::1], i1[::1]))"
                "(u1[::1], i8[::1], i1[::1], i8, i8, b1, f8, b1, b1)",
    "document_modes": "i1[::1](u1[::1], i8[::1], b1, f8)",
    "exact_hashes": "u8[:, ::1](u1[::1], i8[::1], b1, b1, b1)",
    "simhash_fingerprints": "u8[::1](u8[::1], i8[::1])",
    "minhash_signatures": "u8[:, ::1](u8[::1], i8[::1], i8, u8)",
    "band_keys": "u8[:, ::1](u8[:, ::1], i8, i8)",
    "fmix64": "u8(u8)",
}

CLUSTER_SIGNATURES = {  # of the union-find kernels (unionfind.py)
    "cluster_u32": "UniTuple(i8, 2)(i8[::1], i8[::1], i8[::1], i8, u4[::1], i8[::1], f8)",
    "cluster_u64": "UniTuple(i8, 2)(i8[::1], i8[::1], i8[::1], i8, u8[::1], i8[::1], f8)",
    "gather_u8": "u1[::1](u1[::1], i8[::1], i8[::1])",
    "gather_u32": "u4[::1](u4[::1], i8[::1], i8[::1])",
    "gather_u64": "u8[::1](u8[::1], i8[::1], i8[::1])",
    "roots": "i8[::1](i8[::1])",
    "union": "i8(i8[::1], i8, i8)",
    "set_jaccard": "f8(u4[::1], u4[::1], u8[::1], u1[::1])",
}


def kernels():
    """The module of dedup kernels: compiled ahead of time where that can be had, else
    numba's JIT."""
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = aot.load("llmkit.data.dedup._kernels", SIGNATURES, what="the dedup kernels")
    return _KERNELS


def cluster_kernels():
    """The module of union-find kernels, as `kernels` loads the sketches'."""
    global _CLUSTER_KERNELS
    if _CLUSTER_KERNELS is None:
        _CLUSTER_KERNELS = aot.load("llmkit.data.dedup._cluster_kernels", CLUSTER_SIGNATURES,
                                    what="the dedup cluster kernels")
    return _CLUSTER_KERNELS
