"""Exact duplicates: a 128-bit hash of each document's normalised text.

Normalisation is configurable: Unicode lower-casing, whitespace runs collapsed to one space
(and trimmed), punctuation dropped (the same punctuation classes as shingling). The two
64-bit halves are independent hashes of the same normalised bytes; the first keys the
buckets, the second confirms a match, so a false merge needs a 128-bit collision.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from llmkit.data.dedup.shingles import (_ASCII_CLASS, _PUNCT, _SPACE, _ascii_only,
                                        _char_class, _decode, fmix64, lowercase, text_buffers)

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MIX_PRIME = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class ExactConfig:
    lowercase: bool = False         # "Hello" and "hello" are the same document
    collapse_whitespace: bool = True  # runs of whitespace count as one space; ends trimmed
    strip_punctuation: bool = False   # punctuation is ignored


def exact_hashes(texts, cfg: ExactConfig) -> np.ndarray:
    """(n, 2) uint64: two independent hashes of each document's normalised text."""
    data, offsets = text_buffers(texts)
    if cfg.lowercase and not _ascii_only(data, offsets):
        data, offsets = text_buffers(lowercase(texts))
    return _exact_kernel(data, offsets, cfg.lowercase, cfg.collapse_whitespace,
                         cfg.strip_punctuation)


@njit(cache=True)
def _exact_kernel(data, offsets, lower_ascii, collapse_whitespace, strip_punctuation):
    n = len(offsets) - 1
    out = np.empty((n, 2), np.uint64)
    for d in range(n):
        h1 = _FNV_OFFSET
        h2 = np.uint64(0x243F6A8885A308D3)
        length = np.uint64(0)
        pending_space = False
        i, end = offsets[d], offsets[d + 1]
        while i < end:
            if data[i] < 0x80:
                width, cls = 1, _ASCII_CLASS[data[i]]
            else:
                cp, width = _decode(data, i, end)
                cls = _char_class(cp)
            if strip_punctuation and cls == _PUNCT:
                i += width
                continue
            if collapse_whitespace and cls == _SPACE:
                pending_space = length > 0
                i += width
                continue
            if pending_space:
                h1 = (h1 ^ np.uint64(32)) * _FNV_PRIME
                h2 = (h2 + np.uint64(32)) * _MIX_PRIME
                h2 ^= h2 >> np.uint64(31)
                length += np.uint64(1)
                pending_space = False
            for k in range(i, i + width):
                byte = np.uint64(data[k])
                if lower_ascii and width == 1 and byte >= 0x41 and byte <= 0x5A:
                    byte += np.uint64(0x20)
                h1 = (h1 ^ byte) * _FNV_PRIME
                h2 = (h2 + byte) * _MIX_PRIME
                h2 ^= h2 >> np.uint64(31)
            length += np.uint64(width)
            i += width
        out[d, 0] = fmix64(h1 ^ length)
        out[d, 1] = fmix64(h2 + length * _FNV_PRIME)
    return out
