"""64-bit Charikar SimHash and the permuted-blocks tables that find near fingerprints.

A fingerprint bit is the sign of the sum, over the document's distinct shingles, of ±1 for
that bit of the shingle hash; documents sharing most shingles share most bits. Distinct
shingles, not counts: counted, the few most frequent words decide most bits and unrelated
documents get near fingerprints.
Pairs within Hamming distance k are found without comparing all pairs (Manku, Jain & Das
Sarma 2007): split the 64 bits into `blocks` blocks; two fingerprints that differ in at most k
bits agree on at least `blocks − k` whole blocks, so one table per choice of `blocks − k`
blocks, keyed by those bits, puts every such pair in a common bucket. More blocks mean longer
keys (fewer chance collisions) and more tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from math import comb

import numpy as np

from llmkit.data.dedup.compiled import kernels
from llmkit.data.dedup.shingles import ShingleConfig
from llmkit.errors import ConfigError


def _word_features() -> ShingleConfig:
    # single words (character bigrams for CJK): an edit moves a fingerprint least when each
    # feature is small, and Hamming distance grows fast with the share of features changed
    return ShingleConfig(word_ngram=1, char_ngram=2)


@dataclass
class SimHashConfig:
    hamming_k: int = 6          # fingerprints differing in at most this many bits are duplicates
    blocks: int = 8             # blocks the 64 bits are split into (> hamming_k); tables =
    #                             C(blocks, hamming_k), key length ≈ 64·(blocks−k)/blocks bits:
    #                             raise it for corpora of millions (fewer chance collisions)
    shingles: ShingleConfig = field(default_factory=_word_features)  # the features hashed

    def __post_init__(self):
        if not 0 <= self.hamming_k < 32:
            raise ConfigError(f"simhash.hamming_k must be in [0, 32), got {self.hamming_k}")
        if not self.hamming_k < self.blocks <= 64:
            raise ConfigError(f"simhash.blocks must be in ({self.hamming_k}, 64] "
                              f"(more than hamming_k), got {self.blocks}")
        if comb(self.blocks, self.hamming_k) > 1000:
            raise ConfigError(f"simhash: C(blocks={self.blocks}, hamming_k={self.hamming_k}) "
                              "tables is over 1000; use fewer blocks")


def simhash_fingerprints(batch) -> np.ndarray:
    """(n,) uint64 fingerprints of a ShingleBatch (0 for a document without shingles)."""
    return kernels().simhash_fingerprints(batch.hashes, batch.offsets)


def block_masks(hamming_k: int, blocks: int) -> np.ndarray:
    """One uint64 mask per table: the bits of `blocks − hamming_k` of the blocks."""
    edges = np.linspace(0, 64, blocks + 1).round().astype(int)
    block_bits = [sum(1 << bit for bit in range(edges[i], edges[i + 1])) for i in range(blocks)]
    masks = [sum(block_bits[i] for i in chosen)
             for chosen in combinations(range(blocks), blocks - hamming_k)]
    return np.array(masks, dtype=np.uint64)


def table_keys(fingerprints: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """(tables, n) uint64: each fingerprint's bits under each table's mask."""
    return fingerprints[None, :] & masks[:, None]
