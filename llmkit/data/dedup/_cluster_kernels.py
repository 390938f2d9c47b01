"""The compiled kernels of llmkit.data.dedup's clusters (numba): union-find over the verified
pairs of each bucket (`llmkit.data.dedup.unionfind` says what each computes), and the gather of
ragged payloads it verifies with. Loaded as `_kernels` is (`compiled.cluster_kernels`): compiled
ahead of time where that can be had, else numba's JIT.
"""

import numpy as np
from numba import njit

from llmkit.data.dedup.unionfind import ACCEPT, HAMMING, JACCARD


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
def cluster(parent, members, bucket_offsets, verify, values, value_offsets, param):
    verified = accepted = 0
    reps = np.empty(max(1, len(members)), np.int64)
    longest = 1
    for m in members:
        longest = max(longest, value_offsets[m + 1] - value_offsets[m])
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
def gather(stored, starts, lengths):
    out = np.empty(lengths.sum(), stored.dtype)
    pos = 0
    for i in range(len(starts)):
        out[pos:pos + lengths[i]] = stored[starts[i]:starts[i] + lengths[i]]
        pos += lengths[i]
    return out


@njit(cache=True)
def roots(parent):
    out = np.empty(len(parent), np.int64)
    for d in range(len(parent)):
        out[d] = find(parent, d)
    return out


# one compiled function per payload type (ahead of time, a name has one signature)
cluster_u32 = cluster_u64 = cluster
gather_u8 = gather_u32 = gather_u64 = gather
