"""MinHash signatures (one permutation, densified), LSH band keys, the bands × rows choice.

A signature has `num_perm` 64-bit slots. Classic MinHash hashes every shingle once per slot
(k multiply-adds per shingle); here every shingle is hashed once: its hash picks a slot
(its top bits) and the slot keeps the smallest hash it receives — one-permutation hashing
(Li, Owen & Zhang 2012). A slot no shingle reached is filled by optimal densification
(Shrivastava 2017): it copies the slot that a fixed hash sequence of (slot, attempt) first
hits among the filled ones, identically for every document. Two documents agree on a slot
with probability equal to their Jaccard similarity, as with k permutations, so estimates
and LSH behave as datasketch's (tests check both against it) while the kernel does one hash
and one compare per shingle instead of num_perm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llmkit.data.dedup.compiled import kernels
from llmkit.data.dedup.shingles import ShingleConfig
from llmkit.errors import ConfigError


@dataclass
class MinHashConfig:
    num_perm: int = 128         # signature slots (datasketch's num_perm); the LSH bands
    #                             read bands × rows ≤ num_perm of them
    threshold: float = 0.5      # Jaccard similarity at which two documents are duplicates
    bands: int = 0              # LSH bands; 0 = chosen from threshold and num_perm
    rows: int = 0               # rows per band; 0 = chosen with bands
    false_positive_weight: float = 0.05  # weights of the band/row choice (as datasketch's);
    false_negative_weight: float = 0.95  # candidates are verified, so misses cost more
    verify: bool = True         # keep a candidate pair only if its exact shingle Jaccard ≥
    #                             threshold (off: every band collision is a duplicate, as
    #                             datatrove does)
    seed: int = 1               # permutation seed; signatures of different seeds differ
    shingles: ShingleConfig = field(default_factory=ShingleConfig)  # what the sets hold

    def __post_init__(self):
        if self.num_perm < 1:
            raise ConfigError(f"minhash.num_perm must be ≥ 1, got {self.num_perm}")
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError(f"minhash.threshold must be in (0, 1], got {self.threshold}")
        if (self.bands == 0) != (self.rows == 0):
            raise ConfigError("set minhash.bands and minhash.rows together (or neither)")
        if self.bands < 0 or self.rows < 0 or self.bands * self.rows > self.num_perm:
            raise ConfigError(f"minhash.bands × rows = {self.bands} × {self.rows} must be "
                              f"≤ num_perm = {self.num_perm}")
        if self.false_positive_weight < 0 or self.false_negative_weight < 0 or (
                self.false_positive_weight + self.false_negative_weight == 0):
            raise ConfigError("minhash false_positive_weight/false_negative_weight must be "
                              "≥ 0 and not both 0")

    def lsh(self) -> tuple[int, int]:
        """(bands, rows): as given, or the weighted-error optimum for the threshold."""
        if self.bands:
            return self.bands, self.rows
        return lsh_params(self.threshold, self.num_perm, self.false_positive_weight,
                          self.false_negative_weight)


def minhash_signatures(batch, num_perm: int, seed: int = 1) -> np.ndarray:
    """(n, num_perm) uint64 signatures of a ShingleBatch; a document without shingles gets
    all-ones slots (so empty documents match each other and nothing else)."""
    salt = kernels().fmix64(np.uint64(seed * 0x9E3779B97F4A7C15 % 2**64))
    return kernels().minhash_signatures(batch.hashes, batch.offsets, num_perm, salt)


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(bands, n) uint64: one hash per band of `rows` consecutive signature slots."""
    return kernels().band_keys(np.ascontiguousarray(signatures, np.uint64), bands, rows)


def lsh_params(threshold: float, num_perm: int, false_positive_weight: float = 0.5,
               false_negative_weight: float = 0.5) -> tuple[int, int]:
    """(bands, rows) minimising the weighted areas of false positives below `threshold` and
    false negatives above it — datasketch's `_optimal_param`, integrated by Gauss–Legendre
    quadrature (exact for these polynomials) over all candidates at once."""
    nodes, weights = np.polynomial.legendre.leggauss(max(64, num_perm // 2 + 1))
    below_s = (nodes + 1) * threshold / 2
    below_w = weights * threshold / 2
    above_s = threshold + (nodes + 1) * (1 - threshold) / 2
    above_w = weights * (1 - threshold) / 2
    best, best_error = (1, 1), float("inf")
    for b in range(1, num_perm + 1):
        r = np.arange(1, num_perm // b + 1, dtype=np.float64)[:, None]
        fp = ((1 - (1 - below_s ** r) ** b) * below_w).sum(axis=1)
        fn = (((1 - above_s ** r) ** b) * above_w).sum(axis=1)
        error = fp * false_positive_weight + fn * false_negative_weight
        i = int(np.argmin(error))
        if error[i] < best_error:
            best_error, best = float(error[i]), (b, i + 1)
    return best
