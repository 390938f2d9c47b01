"""Clusters from buckets: union-find over verified candidate pairs, compiled with numba.

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
from numba import njit

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
    return _cluster_kernel(parent, members, bucket_offsets, verify, values, value_offsets,
                           float(param))


def gather_ragged(stored: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """stored[starts[i]:starts[i]+lengths[i]] for every i, concatenated (stored may be a
    memory-mapped file: only the slices asked for are read)."""
    return _gather_kernel(stored, starts.astype(np.int64), lengths.astype(np.int64))


def roots(parent: np.ndarray) -> np.ndarray:
    """Each document's cluster root (its smallest member), fully compressed."""
    return _roots_kernel(parent)


@njit(cache=True)
def find(parent, x):
    root = x
    while parent[root] != root:
        root = parent[root]
    while parent[x] != root:
        parent[x], x = root, parent[x]
    return root


@njit(cache=True)
def union(parent, x, y):
    """Join the clusters of x and y under the smaller root; returns the new root."""
    rx, ry = find(parent, x), find(parent, y)
    if rx < ry:
        parent[ry] = rx
        return rx
    parent[rx] = ry
    return ry


@njit(cache=True)
def set_jaccard(a, b, keys, seen):
    """Jaccard similarity of the distinct values of a and b (two empty sets: 1).

    Counts through one open-addressing table instead of sorting: `keys` (uint64) and `seen`
    (uint8) are scratch of a power-of-two size > len(a) + len(b)."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    size = 1
    while size < 2 * (len(a) + len(b)):
        size *= 2
    mask = size - 1
    keys[:size] = 0
    union = common = 0
    for side in range(2):
        values = a if side == 0 else b
        flag = np.uint8(1 + side)
        for v in values:
            key = np.uint64(v) + np.uint64(1)  # 0 marks an empty slot
            slot = np.int64(v) & mask
            while keys[slot] != 0 and keys[slot] != key:
                slot = (slot + 1) & mask
            if keys[slot] == 0:
                keys[slot] = key
                seen[slot] = flag
                union += 1
            elif seen[slot] == 1 and flag == 2:
                seen[slot] = 3
                common += 1
    return common / union


@njit(cache=True)
def _verified(verify, values, value_offsets, x, y, param, keys, seen):
    if verify == ACCEPT:
        return True
    vx = values[value_offsets[x]:value_offsets[x + 1]]
    vy = values[value_offsets[y]:value_offsets[y + 1]]
    if verify == JACCARD:
        return set_jaccard(vx, vy, keys, seen) >= param
    if verify == HAMMING:
        diff = np.uint64(vx[0]) ^ np.uint64(vy[0])
        bits = 0
        while diff:
            diff &= diff - np.uint64(1)
            bits += 1
        return bits <= param
    return vx[0] == vy[0]


@njit(cache=True)
def _cluster_kernel(parent, members, bucket_offsets, verify, values, value_offsets, param):
    verified = accepted = 0
    reps = np.empty(max(1, len(members)), np.int64)
    longest = 1
    for d in range(len(value_offsets) - 1):
        longest = max(longest, value_offsets[d + 1] - value_offsets[d])
    keys = np.empty(8 * longest, np.uint64)
    seen = np.empty(8 * longest, np.uint8)
    for g in range(len(bucket_offsets) - 1):
        n_reps = 0
        for m in members[bucket_offsets[g]:bucket_offsets[g + 1]]:
            new_cluster = True
            for k in range(n_reps):
                r = reps[k]
                if find(parent, r) == find(parent, m):
                    new_cluster = False
                    continue
                verified += 1
                if _verified(verify, values, value_offsets, r, m, param, keys, seen):
                    accepted += 1
                    union(parent, r, m)
                    new_cluster = False
            if new_cluster:
                reps[n_reps] = m
                n_reps += 1
    return verified, accepted


@njit(cache=True)
def _gather_kernel(stored, starts, lengths):
    out = np.empty(lengths.sum(), stored.dtype)
    pos = 0
    for i in range(len(starts)):
        out[pos:pos + lengths[i]] = stored[starts[i]:starts[i] + lengths[i]]
        pos += lengths[i]
    return out


@njit(cache=True)
def _roots_kernel(parent):
    out = np.empty(len(parent), np.int64)
    for d in range(len(parent)):
        out[d] = find(parent, d)
    return out


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
