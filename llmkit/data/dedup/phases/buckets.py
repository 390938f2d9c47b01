"""Phase 2: group the documents that share an LSH key."""

from __future__ import annotations

import numpy as np

from llmkit.data.dedup import unionfind
from llmkit.data.dedup.phases.base import DedupPhase
from llmkit.data.dedup.phases.signatures import read_into

BUCKET_FILE = "bucket.npz"


class Buckets(DedupPhase):
    """One task per key row K (a MinHash band, a SimHash table): `buckets/part-K/bucket.npz`
    holds the documents sharing a value of that row (members, offsets; see
    unionfind.bucket_groups). Memory: one key per document (8 bytes × documents, sorted)."""

    name = "buckets"

    def __len__(self) -> int:
        return self.plan.sketcher.n_keys

    def run(self, key: int) -> dict:
        plan = self.plan
        column = np.empty(int(plan.shard_rows().sum()), np.uint64)
        pos = 0
        for s in range(len(plan.shards)):
            folder = plan.phases["signatures"].folder(s)
            with open(folder / "keys.bin", "rb", buffering=0) as keys:
                start = 0  # of the batch's block of keys: n_keys rows of `rows` keys
                for rows in np.load(folder / "blocks.npy").tolist():
                    read_into(keys, 8 * (start + key * rows), column[pos:pos + rows])
                    start += plan.sketcher.n_keys * rows
                    pos += rows
        members, offsets = unionfind.bucket_groups(column)
        del column
        np.savez(self.temporary(key) / BUCKET_FILE, members=members, offsets=offsets)
        return {"buckets": len(offsets) - 1, "members": len(members)}


def bucket_groups(plan):
    """(members, offsets) of every key row's buckets, one row at a time."""
    for key in range(plan.sketcher.n_keys):
        with np.load(plan.bucket_file(key)) as f:
            yield f["members"], f["offsets"]
