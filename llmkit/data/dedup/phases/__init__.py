"""The four phases of a dedup run: signatures -> buckets -> clusters -> filter.

Each phase is a folder in the artifact's work area (`Builder.work_dir`, kept across killed
runs) and is made of tasks; a task writes its files under a temporary name, renames them,
then writes its `.done` marker with their sizes (`workspace.seal`), so a rerun skips exactly
the finished tasks and redoes one whose files were lost or cut short since.

    signatures/part-00003/  keys.bin: per batch (blocks.npy: its rows) n_keys × rows keys;
                            values.bin + lengths.npy: verification payload
    buckets/key-007.npz     documents sharing a value of key row 7 (members, offsets)
    clusters/part-00003.parquet  (row, duplicate_of) of the rows to remove; stats.json
    filter/part-00003/      kept/ and removed/ parquet parts of input shard 3

Tasks: one per input shard (parquet part file) for signatures and filter, one per key row
(MinHash band, SimHash table) for buckets, one in all for clusters. Task t of a phase runs on
`rank = t % world_size`. A document is addressed by its global index: its shard's first
index plus its row in the shard (shards in file order), which is also "input order": each
cluster keeps its smallest index.

Memory: signatures and filter hold one batch of text at a time and stream what they make to
disk; a bucket task holds one key per document (8 bytes × documents, sorted); clusters holds
a few int64 per document and copies the payload of the documents that share a bucket into
one file, which it maps and reads a few MB at a time. No phase holds the corpus text, its
signatures or its payload.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from llmkit.data.dedup import unionfind
from llmkit.data.dedup.shingles import text_buffers
from llmkit.data.dedup.sketch import Sketcher
from llmkit.data.io import PART, DatasetWriter, dataset_files
from llmkit.errors import UserError
from llmkit.workspace import kill_point, link_or_copy, seal, sealed, write_atomic

PHASES = ("signatures", "buckets", "clusters", "filter")


class DedupPlan:
    """The tasks of one dedup run over `input_dir`, with state kept in `work_dir`."""

    def __init__(self, input_dir: Path, work_dir: Path, cfg):
        self.input_dir = Path(input_dir)
        self.work = Path(work_dir)
        self.cfg = cfg
        self.shards = dataset_files(self.input_dir)
        self.sketcher = Sketcher(cfg)
        self.reason = f"{cfg.method}_duplicate"

    # -- tasks and markers ---------------------------------------------------------------
    def tasks(self, phase: str) -> list[int]:
        if phase in ("signatures", "filter"):
            return list(range(len(self.shards)))
        if phase == "buckets":
            return list(range(self.sketcher.n_keys))
        return [0]

    def _marker(self, phase: str, task: int) -> Path:
        name = {"signatures": "part-{:05d}", "buckets": "key-{:03d}", "clusters": "clusters",
                "filter": "part-{:05d}"}[phase].format(task)
        return self.work / phase / f"{name}.done"

    def done(self, phase: str, task: int) -> bool:
        return sealed(self._marker(phase, task)) is not None

    def pending(self, phase: str) -> list[int]:
        return [t for t in self.tasks(phase) if not self.done(phase, t)]

    def _info(self, phase: str, task: int) -> dict:
        return json.loads(self._marker(phase, task).read_text())

    def _outputs(self, phase: str, task: int) -> list[Path]:
        """The files a finished task leaves for the phases after it."""
        if phase == "buckets":
            return [self.work / "buckets" / f"key-{task:03d}.npz"]
        if phase == "clusters":
            return [self.work / "clusters" / "stats.json",
                    *(self.work / "clusters" / f"part-{s:05d}.parquet"
                      for s in range(len(self.shards)))]
        folder = self.work / phase / f"part-{task:05d}"
        return sorted(p for p in folder.rglob("*") if p.is_file())

    def run(self, phase: str, task: int) -> None:
        """Run one task of a phase unless its marker says it is done."""
        if self.done(phase, task):
            return
        index = PHASES.index(phase)
        # each phase checked its own predecessor, so the one before is enough
        if index and self.pending(PHASES[index - 1]):
            p = PHASES[index - 1]
            raise UserError(f"dedup --phase {phase} needs phase {p} finished first "
                            f"({len(self.pending(p))} of its tasks are not done in "
                            f"{self.work / p}); run `llmkit dedup --phase {p}` for every "
                            "rank, then this one")
        (self.work / phase).mkdir(parents=True, exist_ok=True)
        self._marker(phase, task).unlink(missing_ok=True)  # a damaged task's: redone now
        started = time.time()
        info = getattr(self, f"_{phase}")(task)
        _release_freed_memory()
        info["seconds"] = round(time.time() - started, 3)
        seal(self._marker(phase, task), self._outputs(phase, task), info)

    # -- phase 1: signatures (one task per input shard) ----------------------------------
    def _signatures(self, shard: int) -> dict:
        pf = _open_parquet(self.shards[shard])
        if "text" not in pf.schema_arrow.names:
            raise UserError(f"{self.shards[shard]} has no 'text' column; dedup reads datasets "
                            "made by `llmkit ingest`/`clean`")
        n_rows = pf.metadata.num_rows
        final = self.work / "signatures" / f"part-{shard:05d}"
        tmp = _fresh(_temporary(final))
        lengths = np.zeros(n_rows, np.int64)
        blocks = []
        pos = 0
        with open(tmp / "keys.bin", "wb") as keys, open(tmp / "values.bin", "wb") as values:
            for batch in pf.iter_batches(batch_size=self.cfg.batch_rows, columns=["text"],
                                         use_threads=False):
                sketch = self.sketcher(batch.column(0))
                keys.write(np.ascontiguousarray(sketch.keys, np.uint64))
                values.write(np.ascontiguousarray(sketch.values, self.sketcher.values_dtype))
                lengths[pos:pos + batch.num_rows] = sketch.lengths
                blocks.append(batch.num_rows)
                pos += batch.num_rows
        np.save(tmp / "lengths.npy", lengths)
        np.save(tmp / "blocks.npy", np.array(blocks, np.int64))
        _replace_dir(tmp, final)
        return {"rows": n_rows}

    def shard_rows(self) -> np.ndarray:
        return np.array([self._info("signatures", s)["rows"] for s in range(len(self.shards))],
                        dtype=np.int64)

    # -- phase 2: buckets (one task per key row) -----------------------------------------
    def _buckets(self, key: int) -> dict:
        column = np.empty(int(self.shard_rows().sum()), np.uint64)
        pos = 0
        for s in range(len(self.shards)):
            folder = self.work / "signatures" / f"part-{s:05d}"
            with open(folder / "keys.bin", "rb", buffering=0) as keys:
                start = 0  # of the batch's block of keys: n_keys rows of `rows` keys
                for rows in np.load(folder / "blocks.npy").tolist():
                    _read_into(keys, 8 * (start + key * rows), column[pos:pos + rows])
                    start += self.sketcher.n_keys * rows
                    pos += rows
        members, offsets = unionfind.bucket_groups(column)
        del column
        final = self.work / "buckets" / f"key-{key:03d}.npz"
        tmp = _temporary(final)
        tmp = tmp.with_name(tmp.name + ".npz")  # np.savez would add it anyway
        np.savez(tmp, members=members, offsets=offsets)
        os.replace(tmp, final)
        return {"buckets": len(offsets) - 1, "members": len(members)}

    def _bucket_groups(self):
        for key in range(self.sketcher.n_keys):
            with np.load(self.work / "buckets" / f"key-{key:03d}.npz") as f:
                yield f["members"], f["offsets"]

    # -- phase 3: clusters (one task) ----------------------------------------------------
    def _clusters(self, _task: int) -> dict:
        rows = self.shard_rows()
        n = int(rows.sum())
        candidate = np.zeros(n, bool)
        for members, _ in self._bucket_groups():
            candidate[members] = True
        payload = self.work / "clusters" / f"payload.bin.tmp-{os.getpid()}"
        value_offsets = self._write_candidate_payload(candidate, rows, payload)
        del candidate
        parent = unionfind.new_parents(n)
        verified = accepted = 0
        with _MappedPayload(payload, self.sketcher.values_dtype) as values:
            for members, offsets in self._bucket_groups():
                for first, last in _bucket_chunks(offsets, _MEMBERS_AT_ONCE):
                    lo, hi = offsets[first], offsets[last]
                    v, a = unionfind.cluster_buckets(
                        parent, members[lo:hi], offsets[first:last + 1] - lo,
                        self.sketcher.verify, values.array, value_offsets, self.sketcher.param)
                    verified, accepted = verified + v, accepted + a
                    values.release()
        payload.unlink()
        del value_offsets
        root = unionfind.roots(parent)
        del parent
        self._write_removals(root, rows)
        stats = {"documents": n, "candidate_pairs_verified": verified,
                 "candidate_pairs_accepted": accepted, **cluster_stats(root)}
        write_atomic(self.work / "clusters" / "stats.json", json.dumps(stats))
        return stats

    def _write_candidate_payload(self, candidate: np.ndarray, rows: np.ndarray,
                                 path: Path) -> np.ndarray:
        """Write the verification payload of candidate documents only to `path`, a block of
        documents at a time; returns every document's offsets into it (others get an empty
        slice)."""
        dtype = np.dtype(self.sketcher.values_dtype)
        lengths = np.zeros(len(candidate), np.int64)
        base = 0
        with open(path, "wb") as out:
            for s, n_rows in enumerate(rows.tolist()):
                folder = self.work / "signatures" / f"part-{s:05d}"
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
                        _read_into(stored, starts[lo] * dtype.itemsize, block)
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

        bases = np.r_[0, np.cumsum(rows)]
        removed = np.flatnonzero(root != np.arange(len(root)))
        kept_of_removed = root[removed]
        needed = np.unique(kept_of_removed)
        ids = []
        for s in range(len(rows)):
            local = needed[(needed >= bases[s]) & (needed < bases[s + 1])] - bases[s]
            if len(local):
                ids.append(_ids_of_rows(self.shards[s], local, self.cfg.batch_rows))
        ids = pa.concat_arrays(ids) if ids else pa.nulls(0, pa.string())
        for s in range(len(rows)):
            lo, hi = np.searchsorted(removed, [bases[s], bases[s + 1]])
            kept_ids = _take_strings(ids, np.searchsorted(needed, kept_of_removed[lo:hi]))
            table = pa.Table.from_arrays([_int64_array(removed[lo:hi] - bases[s]), kept_ids],
                                         names=["row", "duplicate_of"])
            final = self.work / "clusters" / f"part-{s:05d}.parquet"
            tmp = _temporary(final)
            pq.write_table(table, tmp)
            os.replace(tmp, final)

    # -- phase 4: filter (one task per input shard) --------------------------------------
    def _filter(self, shard: int) -> dict:
        import pyarrow as pa
        import pyarrow.parquet as pq

        removals = pq.ParquetFile(self.work / "clusters" / f"part-{shard:05d}.parquet").read()
        removed_rows = _int64_numpy(removals.column("row"))
        duplicate_of = removals.column("duplicate_of")
        final = self.work / "filter" / f"part-{shard:05d}"
        tmp = _fresh(_temporary(final))
        kept_w, removed_w = DatasetWriter(tmp / "kept"), DatasetWriter(tmp / "removed")
        pos = 0
        for batch in _open_parquet(self.shards[shard]).iter_batches(
                batch_size=self.cfg.batch_rows, use_threads=False):
            table = pa.Table.from_batches([batch])
            lo, hi = np.searchsorted(removed_rows, [pos, pos + batch.num_rows])
            drop = np.zeros(batch.num_rows, bool)
            drop[removed_rows[lo:hi] - pos] = True
            kept_w.write(_rows_where(table, ~drop))
            gone = _rows_where(table, drop)
            gone = _set_column(gone, "reason", _repeated_string(self.reason, gone.num_rows))
            removed_w.write(_set_column(gone, "duplicate_of", duplicate_of.slice(lo, hi - lo)))
            pos += batch.num_rows
        rows_out, rows_removed = kept_w.close(), removed_w.close()
        _replace_dir(tmp, final)
        return {"rows_in": pos, "rows_out": rows_out, "rows_removed": rows_removed}

    # -- commit ---------------------------------------------------------------------------
    def assemble(self, out_dir: Path) -> dict:
        """Link every shard's filter output into `out_dir` (parts renumbered in shard order)
        and return the stage's stats. Needs every filter task done. Links, not moves: the
        work area stays whole until the artifact is committed, so a crash here loses
        nothing."""
        if self.pending("filter"):
            raise UserError(f"dedup: {len(self.pending('filter'))} filter tasks are not done; "
                            "run `llmkit dedup --phase filter` for every rank first")
        out_dir = Path(out_dir)
        counts = {"kept": 0, "removed": 0}
        rows_in = rows_out = rows_removed = 0
        for shard in range(len(self.shards)):
            folder = self.work / "filter" / f"part-{shard:05d}"
            for kind, dest in (("kept", out_dir), ("removed", out_dir / "removed")):
                for f in sorted((folder / kind).glob("part-*.parquet")):
                    dest.mkdir(parents=True, exist_ok=True)
                    kill_point("dedup:assemble")
                    link_or_copy(f, dest / PART.format(counts[kind]))
                    counts[kind] += 1
            info = self._info("filter", shard)
            rows_in += info["rows_in"]
            rows_out += info["rows_out"]
            rows_removed += info["rows_removed"]
        if rows_in != rows_out + rows_removed:  # a bug, never a user error
            raise AssertionError(f"dedup: rows_in {rows_in} != {rows_out} + {rows_removed}")
        clusters = json.loads((self.work / "clusters" / "stats.json").read_text())
        return {"rows_in": rows_in, "rows_out": rows_out, "rows_removed": rows_removed,
                "removed_by_reason": {self.reason: rows_removed} if rows_removed else {},
                "method": self.cfg.method, **self.method_stats(), **clusters,
                "seconds_by_phase": self.phase_seconds()}

    def method_stats(self) -> dict:
        if self.cfg.method == "minhash":
            return {"lsh_bands": self.sketcher.bands, "lsh_rows": self.sketcher.rows}
        if self.cfg.method == "simhash":
            return {"simhash_tables": self.sketcher.n_keys}
        return {}

    def phase_seconds(self) -> dict:
        """Task seconds summed per phase (the work done, whichever machines did it)."""
        return {p: round(sum(self._info(p, t).get("seconds", 0.0) for t in self.tasks(p)
                             if self.done(p, t)), 3) for p in PHASES}


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


def _release_freed_memory() -> None:
    """Give back to the system what the allocators keep of the memory a task freed (Arrow's
    pool and, on glibc, the C heap), so the next phase starts from the same size."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None)
        if hasattr(libc, "malloc_trim"):  # glibc, not musl
            libc.malloc_trim(0)


_MEMBERS_AT_ONCE = 128  # bucket members verified between two releases of the payload's
#                         pages (each maps about 64 KB of it: a few MB in all)
_DOCS_AT_ONCE = 4096    # documents whose payload is read at once to pick the candidates'


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


def _read_into(f, offset: int, out: np.ndarray) -> None:
    """Fill `out` with the file's bytes from `offset` on."""
    view = memoryview(out).cast("B")
    f.seek(offset)
    done = 0
    while done < len(view):
        got = f.readinto(view[done:])
        if not got:
            raise UserError(f"{f.name} ends early: the dedup work area is damaged; delete "
                            f"{Path(f.name).parents[2]} and rerun")
        done += got


def _open_parquet(path: Path):
    import pyarrow.parquet as pq

    # stream a column chunk page by page: by default pyarrow fetches the whole row group's
    # column at once, which for long documents is 100+ MB
    return pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)


def _ids_of_rows(path: Path, rows: np.ndarray, batch_rows: int):
    """The ids (as strings) of the given rows (ascending) of a shard, read a batch at a time."""
    import pyarrow as pa

    pf = _open_parquet(path)
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
            ids.append(_take_strings(batch.column(0), rows[lo:hi] - pos))
        pos += batch.num_rows
    return pa.concat_arrays(ids) if ids else pa.nulls(0, pa.string())


# Rows picked without pyarrow.compute: loading Arrow's compute kernels adds ~8 MB to the
# process, and this stage needs them for nothing else.
def _take_strings(array, indices: np.ndarray):
    """array[indices] of a string array (nulls read as empty strings), as one string array."""
    import pyarrow as pa

    data, offsets = text_buffers(array)
    starts = offsets[indices]
    lengths = offsets[indices + 1] - starts
    chars = unionfind.gather_ragged(data, starts, lengths)
    ends = np.r_[0, np.cumsum(lengths)]
    kind = pa.string() if ends[-1] < 2 ** 31 else pa.large_string()
    ends = ends.astype(np.int32 if kind == pa.string() else np.int64)
    return pa.Array.from_buffers(kind, len(indices), [None, pa.py_buffer(ends),
                                                      pa.py_buffer(chars)])


def _rows_where(table, mask: np.ndarray):
    """The rows of `table` where `mask` is set, as one table of single-chunk columns."""
    import pyarrow as pa

    edges = np.flatnonzero(np.diff(np.r_[0, mask.view(np.int8), 0]))
    runs = [table.slice(a, b - a) for a, b in zip(edges[::2].tolist(), edges[1::2].tolist())]
    if len(runs) == 1 and runs[0].num_rows == table.num_rows:
        return table
    return pa.concat_tables(runs).combine_chunks() if runs else table.slice(0, 0)


# Arrays built from buffers: pyarrow imports pandas (~0.5 s) the first time it converts
# Python or numpy objects, and this stage otherwise never needs it.
def _int64_array(values: np.ndarray):
    import pyarrow as pa

    values = np.ascontiguousarray(values, np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def _int64_numpy(column) -> np.ndarray:
    array = column.combine_chunks()
    if len(array) == 0:
        return np.zeros(0, np.int64)
    return np.frombuffer(array.buffers()[1], np.int64)[array.offset:array.offset + len(array)]


def _repeated_string(value: str, n: int):
    import pyarrow as pa

    data = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(data * n)])


def _set_column(table, name: str, values):
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, values)
    return table.append_column(name, values)


def _temporary(final: Path) -> Path:
    # per process: two runs that wrongly share a task never write into one file
    return final.with_name(f"{final.name}.tmp-{os.getpid()}")


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _replace_dir(tmp: Path, final: Path) -> None:
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
