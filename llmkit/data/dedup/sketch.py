"""Per method: a batch of texts -> bucket keys + what verifies a candidate pair.

Every method reduces to the same shape, so the phases never branch on the method:
`keys` (n_keys × n uint64; documents sharing any one key row's value are candidates) and a
per-document verification payload (`values` split by `lengths`) that `unionfind` checks.

| method  | keys                                   | payload, check                        |
|---------|----------------------------------------|---------------------------------------|
| exact   | first 64 bits of the text hash         | other 64 bits, equal                  |
| simhash | fingerprint under each block mask      | fingerprint, Hamming ≤ k              |
| minhash | one hash per LSH band of the signature | shingle hashes, Jaccard ≥ t           |
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmkit.data.dedup import unionfind
from llmkit.data.dedup.exact import exact_hashes
from llmkit.data.dedup.minhash import band_keys, minhash_signatures
from llmkit.data.dedup.shingles import shingle_hashes, verification_sets
from llmkit.data.dedup.simhash import block_masks, simhash_fingerprints, table_keys


@dataclass
class Sketch:
    keys: np.ndarray     # (n_keys, n) uint64
    values: np.ndarray   # verification payload of all n documents, concatenated
    lengths: np.ndarray  # (n,) int64: payload length of each document


class Sketcher:
    """Built once from a DedupConfig; called on each batch of texts."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.method = cfg.method
        if cfg.method == "exact":
            self.n_keys, self.verify, self.param = 1, unionfind.EQUAL, 0.0
            self.values_dtype = np.uint64
        elif cfg.method == "simhash":
            self.masks = block_masks(cfg.simhash.hamming_k, cfg.simhash.blocks)
            self.n_keys, self.verify = len(self.masks), unionfind.HAMMING
            self.param, self.values_dtype = float(cfg.simhash.hamming_k), np.uint64
        else:
            self.bands, self.rows = cfg.minhash.lsh()
            self.n_keys = self.bands
            self.verify = unionfind.JACCARD if cfg.minhash.verify else unionfind.ACCEPT
            self.param, self.values_dtype = float(cfg.minhash.threshold), np.uint32

    def __call__(self, texts) -> Sketch:
        cfg = self.cfg
        if self.method == "exact":
            h = exact_hashes(texts, cfg.exact)
            return Sketch(h[:, 0][None, :].copy(), h[:, 1].copy(), np.ones(len(h), np.int64))
        if self.method == "simhash":
            shingles = shingle_hashes(texts, cfg.simhash.shingles)
            n = len(shingles)
            fp = simhash_fingerprints(shingles)
            return Sketch(table_keys(fp, self.masks), fp, np.ones(n, np.int64))
        shingles = shingle_hashes(texts, cfg.minhash.shingles)
        n = len(shingles)
        keys = band_keys(minhash_signatures(shingles, cfg.minhash.num_perm, cfg.minhash.seed),
                         self.bands, self.rows)
        if self.verify == unionfind.ACCEPT:
            return Sketch(keys, np.zeros(0, np.uint32), np.zeros(n, np.int64))
        values, lengths = verification_sets(shingles)
        return Sketch(keys, values, lengths)


def cluster_in_memory(sketch: Sketch, sketcher: Sketcher) -> tuple[np.ndarray, dict]:
    """Roots of all documents of one in-memory sketch (the phases' result, without disk),
    and the pair counts. For tests and small corpora; the stage streams instead."""
    n = sketch.keys.shape[1]
    parent = unionfind.new_parents(n)
    offsets = np.r_[0, np.cumsum(sketch.lengths)].astype(np.int64)
    values = sketch.values
    verified = accepted = 0
    for row in sketch.keys:
        members, bucket_offsets = unionfind.bucket_groups(row)
        v, a = unionfind.cluster_buckets(parent, members, bucket_offsets, sketcher.verify,
                                         values, offsets, sketcher.param)
        verified, accepted = verified + v, accepted + a
    return unionfind.roots(parent), {"pairs_verified": verified, "pairs_accepted": accepted}
