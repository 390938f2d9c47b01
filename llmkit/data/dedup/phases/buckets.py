"""Phase 2: group the documents that share an LSH key."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from llmkit.data.dedup import unionfind
from llmkit.data.dedup.phases.base import Phase
from llmkit.data.dedup.phases.signatures import read_into
from llmkit.data.io import temporary_path


class Buckets(Phase):
    """One task per key row K (a MinHash band, a SimHash table): `buckets/key-K.npz` holds
    the documents sharing a value of that row (members, offsets; see unionfind.bucket_groups).
    Memory: one key per document (8 bytes × documents, sorted)."""

    name = "buckets"

    def tasks(self) -> list[int]:
        return list(range(self.plan.sketcher.n_keys))

    def marker(self, key: int) -> Path:
        return self.plan.work / self.name / f"key-{key:03d}.done"

    def outputs(self, key: int) -> list[Path]:
        return [self.plan.bucket_file(key)]

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
        final = plan.bucket_file(key)
        tmp = temporary_path(final)
        tmp = tmp.with_name(tmp.name + ".npz")  # np.savez would add it anyway
        np.savez(tmp, members=members, offsets=offsets)
        os.replace(tmp, final)
        return {"buckets": len(offsets) - 1, "members": len(members)}


def bucket_groups(plan):
    """(members, offsets) of every key row's buckets, one row at a time."""
    for key in range(plan.sketcher.n_keys):
        with np.load(plan.bucket_file(key)) as f:
            yield f["members"], f["offsets"]
