"""Clusters from buckets: union-find over verified candidate pairs, in compiled kernels.

A bucket is a group of documents that share one LSH key (a MinHash band, a SimHash table
key, an exact hash). Members are visited in document order; each is verified against one
representative of every cluster already met in the bucket and merged with each one it
matches. A pair already in one cluster is never verified again (so k copies of a document
cost k − 1 verifications, not k²/2), and a look-alike that lands in a bucket first does not
stop the true duplicates behind it from meeting each other. Every cluster's root is its
smallest document index: the document kept is the first in input order.
"""

from __future__ import annotations

import numpy as np

from llmkit.data.dedup.compiled import cluster_kernels

# verification of a candidate pair
ACCEPT, JACCARD, HAMMING, EQUAL = 0, 1, 2, 3


def new_parents(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


def cluster_buckets(parent: np.ndarray, members: np.ndarray, bucket_offsets: np.ndarray,
                    verify: int, values: np.ndarray, value_offsets: np.ndarray,
                    param: float) -> tuple[int, int]:
    """Merge verified pairs of each bucket into `parent` (in place).

    Bucket g is members[bucket_offsets[g]:bucket_offsets[g+1]] (ascending document indices).
    Document d's verification payload is values[value_offsets[d]:value_offsets[d+1]]:
    shingle hashes, repeats allowed (JACCARD ≥ param), one fingerprint (HAMMING ≤ param) or one
    hash (EQUAL). Returns (pairs verified, pairs accepted).
    """
    kernels = cluster_kernels()
    cluster = kernels.cluster_u32 if values.dtype == np.uint32 else kernels.cluster_u64
    return cluster(parent, _int64(members), _int64(bucket_offsets), verify, values,
                   _int64(value_offsets), float(param))


def gather_ragged(stored: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """stored[starts[i]:starts[i]+lengths[i]] for every i, concatenated (stored may be a
    memory-mapped file: only the slices asked for are read)."""
    kernels = cluster_kernels()
    gather = {np.uint8: kernels.gather_u8, np.uint32: kernels.gather_u32,
              np.uint64: kernels.gather_u64}[stored.dtype.type]
    return gather(stored, _int64(starts), _int64(lengths))


def roots(parent: np.ndarray) -> np.ndarray:
    """Each document's cluster root (its smallest member), fully compressed."""
    return cluster_kernels().roots(parent)


def union(parent: np.ndarray, x: int, y: int) -> int:
    """Join the clusters of x and y under the smaller root (in place); returns the new root."""
    return cluster_kernels().union(parent, x, y)


def set_jaccard(a: np.ndarray, b: np.ndarray, keys: np.ndarray, seen: np.ndarray) -> float:
    """Jaccard similarity of the distinct values of uint32 arrays a and b (two empty sets:
    1); `keys` (uint64) and `seen` (uint8) are scratch of a power-of-two size > len(a) + len(b)."""
    return cluster_kernels().set_jaccard(a, b, keys, seen)


def _int64(values) -> np.ndarray:
    return np.ascontiguousarray(values, np.int64)


def bucket_groups(keys: np.ndarray, first_index: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Documents sharing a key: (members, offsets) of every key held by ≥ 2 documents.

    keys[i] belongs to document first_index + i; members of a bucket are ascending.
    """
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    sizes = np.diff(np.r_[starts, len(keys)])
    shared = sizes >= 2
    in_shared = np.repeat(shared, sizes)
    members = order[in_shared].astype(np.int64) + first_index
    offsets = np.r_[0, np.cumsum(sizes[shared])].astype(np.int64)
    return members, offsets
