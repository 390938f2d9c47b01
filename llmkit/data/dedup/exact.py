"""Exact duplicates: a 128-bit hash of each document's normalised text.

Normalisation is configurable: Unicode lower-casing, whitespace runs collapsed to one space
(and trimmed), punctuation dropped (the same punctuation classes as shingling). The two
64-bit halves are independent hashes of the same normalised bytes; the first keys the
buckets, the second confirms a match, so a false merge needs a 128-bit collision.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmkit.data.arrow import string_buffers
from llmkit.data.dedup.compiled import kernels
from llmkit.data.dedup.shingles import _ascii_only, lowercase


@dataclass
class ExactConfig:
    lowercase: bool = False         # "Hello" and "hello" are the same document
    collapse_whitespace: bool = True  # runs of whitespace count as one space; ends trimmed
    strip_punctuation: bool = False   # punctuation is ignored


def exact_hashes(texts, cfg: ExactConfig) -> np.ndarray:
    """(n, 2) uint64: two independent hashes of each document's normalised text."""
    data, offsets = string_buffers(texts)
    if cfg.lowercase and not _ascii_only(data, offsets):
        data, offsets = string_buffers(lowercase(texts))
    return kernels().exact_hashes(data, offsets, cfg.lowercase, cfg.collapse_whitespace,
                         cfg.strip_punctuation)
