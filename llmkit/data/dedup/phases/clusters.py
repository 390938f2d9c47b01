"""Phase 3: verify the candidate pairs of every bucket and join the duplicates into clusters."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from llmkit.data.arrow import numbers, string_buffers
from llmkit.data.dedup import unionfind
from llmkit.data.dedup.phases.base import DedupPhase
from llmkit.data.dedup.phases.buckets import bucket_groups
from llmkit.data.dedup.phases.signatures import read_into
from llmkit.data.io import open_parquet, part_path
from llmkit.errors import UserError

STATS_FILE = "stats.json"
_MEMBERS_AT_ONCE = 128  # bucket members verified between two releases of the payload's
#                         pages (each maps about 64 KB of it: a few MB in all)
_DOCS_AT_ONCE = 4096    # documents whose payload is read at once to pick the candidates'


class Clusters(DedupPhase):
    """One task in all: `clusters/part-00000/part-S.parquet` holds (row, duplicate_of) of the
    rows of input shard S to remove, `clusters/part-00000/stats.json` the cluster statistics.
    Each cluster keeps its smallest document index (the first in input order).

    Memory: a few int64 per document; the payload of the documents that share a bucket is
    copied into one file, which is mapped and read a few MB at a time."""

    name = "clusters"

    def __len__(self) -> int:
        return 1

    def run(self, _task: int) -> dict:
        plan = self.plan
        rows = plan.shard_rows()
        n = int(rows.sum())
        candidate = np.zeros(n, bool)
        for members, _ in bucket_groups(plan):
            candidate[members] = True
        payload = self.temporary(0) / "payload.bin"
        value_offsets = self._write_candidate_payload(candidate, rows, payload)
        del candidate
        parent = unionfind.new_parents(n)
        verified = accepted = 0
        with _MappedPayload(payload, plan.sketcher.values_dtype) as values:
            for members, offsets in bucket_groups(plan):
                for first, last in _bucket_chunks(offsets, _MEMBERS_AT_ONCE):
                    lo, hi = offsets[first], offsets[last]
                    v, a = unionfind.cluster_buckets(
                        parent, members[lo:hi], offsets[first:last + 1] - lo,
                        plan.sketcher.verify, values.array, value_offsets, plan.sketcher.param)
                    verified, accepted = verified + v, accepted + a
                    values.release()
        payload.unlink()
        del value_offsets
        root = unionfind.roots(parent)
        del parent
        self._write_removals(root, rows)
        stats = {"documents": n, "candidate_pairs_verified": verified,
                 "candidate_pairs_accepted": accepted, **cluster_stats(root)}
        (self.temporary(0) / STATS_FILE).write_text(json.dumps(stats))
        return stats

    def _write_candidate_payload(self, candidate: np.ndarray, rows: np.ndarray,
                                 path: Path) -> np.ndarray:
        """Write the verification payload of candidate documents only to `path`, a block of
        documents at a time; returns every document's offsets into it (others get an empty
        slice)."""
        dtype = np.dtype(self.plan.sketcher.values_dtype)
        lengths = np.zeros(len(candidate), np.int64)
        base = 0
        with open(path, "wb") as out:
            for s, n_rows in enumerate(rows.tolist()):
                folder = self.plan.phases["signatures"].folder(s)
                local = np.load(folder / "lengths.npy")
                ends = np.cumsum(local)
                starts = ends - local
                with open(folder / "values.bin", "rb", buffering=0) as stored:
                    for lo in range(0, n_rows, _DOCS_AT_ONCE):
                        hi = min(lo + _DOCS_AT_ONCE, n_rows)
                        wanted = lo + np.flatnonzero(candidate[base + lo:base + hi])
                        if not len(wanted) or not local[wanted].any():
                            continue
                        block = np.empty(ends[hi - 1] - starts[lo], dtype)
                        read_into(stored, starts[lo] * dtype.itemsize, block)
                        _write_in_small_pieces(out, unionfind.gather_ragged(
                            block, starts[wanted] - starts[lo], local[wanted]))
                        lengths[base + wanted] = local[wanted]
                base += n_rows
        return np.r_[0, np.cumsum(lengths)].astype(np.int64)

    def _write_removals(self, root: np.ndarray, rows: np.ndarray) -> None:
        """clusters/part-S.parquet: (row, duplicate_of) for every removed row of shard S,
        duplicate_of being the id of the document its cluster keeps."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        plan = self.plan
        bases = np.r_[0, np.cumsum(rows)]
        removed = np.flatnonzero(root != np.arange(len(root)))
        kept_of_removed = root[removed]
        needed = np.unique(kept_of_removed)
        ids = []
        for s in range(len(rows)):
            local = needed[(needed >= bases[s]) & (needed < bases[s + 1])] - bases[s]
            if len(local):
                ids.append(ids_of_rows(plan.shards[s], local, plan.cfg.batch_rows))
        ids = pa.concat_arrays(ids) if ids else pa.nulls(0, pa.string())
        for s in range(len(rows)):
            lo, hi = np.searchsorted(removed, [bases[s], bases[s + 1]])
            kept_ids = take_strings(ids, np.searchsorted(needed, kept_of_removed[lo:hi]))
            row = np.ascontiguousarray(removed[lo:hi] - bases[s], np.int64)
            table = pa.Table.from_arrays([numbers(row), kept_ids], names=["row", "duplicate_of"])
            pq.write_table(table, part_path(self.temporary(0), s))


def cluster_stats(root: np.ndarray) -> dict:
    """Clusters of ≥ 2 documents: how many, the largest, sizes in power-of-two bins."""
    sizes = np.bincount(root, minlength=len(root))
    sizes = sizes[sizes >= 2]
    bins: dict[str, int] = {}
    lo = 2
    while len(sizes) and lo <= sizes.max():
        hi = 2 * lo - 1
        count = int(((sizes >= lo) & (sizes <= hi)).sum())
        if count:
            bins[str(lo) if lo == hi else f"{lo}-{hi}"] = count
        lo = hi + 1
    return {"clusters": int(len(sizes)), "largest_cluster": int(sizes.max()) if len(sizes) else 0,
            "documents_in_clusters": int(sizes.sum()), "cluster_sizes": bins}


class _MappedPayload:
    """The candidates' payload file as an array, memory-mapped: verification reads it in
    random order, and `release()` drops the pages read so far from this process (they stay in
    the page cache), so the process never holds more than a chunk's worth of it."""

    def __init__(self, path: Path, dtype):
        self.path, self.dtype = path, np.dtype(dtype)

    def __enter__(self):
        import mmap

        self._file = open(self.path, "rb")
        if os.fstat(self._file.fileno()).st_size == 0:  # mmap cannot map an empty file
            self._map, self.array = None, np.zeros(0, self.dtype)
        else:
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self.array = np.frombuffer(self._map, self.dtype)
            self._map.madvise(mmap.MADV_RANDOM)  # no read-ahead into large folios
        return self

    def release(self) -> None:
        import mmap

        if self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED)

    def __exit__(self, *exc):
        self.array = None  # the map cannot close while an array views it
        if self._map is not None:
            self._map.close()
        self._file.close()


def _write_in_small_pieces(f, values: np.ndarray) -> None:
    """Write an array as 64 KB writes: the page cache then holds the file in folios of at
    most 64 KB, and a page fault of its memory map maps one of those, not a large folio of
    a megabyte or more that one large write would have made (Linux ≥ 6.x, ext4/xfs)."""
    data = memoryview(values).cast("B")
    for at in range(0, len(data), 1 << 16):
        f.write(data[at:at + (1 << 16)])


def _bucket_chunks(offsets: np.ndarray, members: int):
    """(first, last) bucket ranges of about `members` members each; a bucket is never split."""
    if len(offsets) < 2:
        return
    firsts = np.unique(np.searchsorted(offsets, np.arange(0, offsets[-1], members),
                                       side="right") - 1)
    yield from zip(firsts.tolist(), np.r_[firsts[1:], len(offsets) - 1].tolist())


def ids_of_rows(path: Path, rows: np.ndarray, batch_rows: int):
    """The ids (as strings) of the given rows (ascending) of a shard, read a batch at a time."""
    import pyarrow as pa

    pf = open_parquet(path)
    if "id" not in pf.schema_arrow.names:
        raise UserError(f"{path} has no 'id' column; dedup needs it to name the kept "
                        "document in duplicate_of")
    id_type = pf.schema_arrow.field("id").type
    if not (pa.types.is_string(id_type) or pa.types.is_large_string(id_type)):
        raise UserError(f"{path}: column 'id' is {id_type}, not string; dedup datasets are "
                        "made by `llmkit ingest`/`clean`, which write string ids")
    ids = []
    pos = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=["id"], use_threads=False):
        lo, hi = np.searchsorted(rows, [pos, pos + batch.num_rows])
        if hi > lo:
            ids.append(take_strings(batch.column(0), rows[lo:hi] - pos))
        pos += batch.num_rows
    return pa.concat_arrays(ids) if ids else pa.nulls(0, pa.string())


def take_strings(array, indices: np.ndarray):
    """array[indices] of a string array (nulls read as empty strings), as one string array;
    without pyarrow.compute (see llmkit.data.arrow), gathered by the compiled dedup kernel."""
    import pyarrow as pa

    data, offsets = string_buffers(array)
    starts = offsets[indices]
    lengths = offsets[indices + 1] - starts
    chars = unionfind.gather_ragged(data, starts, lengths)
    ends = np.r_[0, np.cumsum(lengths)]
    kind = pa.string() if ends[-1] < 2 ** 31 else pa.large_string()
    ends = ends.astype(np.int32 if kind == pa.string() else np.int64)
    return pa.Array.from_buffers(kind, len(indices), [None, pa.py_buffer(ends),
                                                      pa.py_buffer(chars)])
