"""The four phases of a dedup run: signatures -> buckets -> clusters -> filter.

Each phase is a folder in the artifact's work area (`Builder.work_dir`, kept across killed
runs) and is made of tasks; a task writes its files under a temporary name, renames them,
then writes its `.done` marker, so a rerun skips exactly the finished tasks.

    signatures/part-00003/  keys.npy (n_keys × rows), values.bin + lengths.npy (payload)
    buckets/key-007.npz     documents sharing a value of key row 7 (members, offsets)
    clusters/part-00003.parquet  (row, duplicate_of) of the rows to remove; stats.json
    filter/part-00003/      kept/ and removed/ parquet parts of input shard 3

Tasks: one per input shard (parquet part file) for signatures and filter, one per key row
(MinHash band, SimHash table) for buckets, one in all for clusters. Task t of a phase runs on
`rank = t % world_size`. A document is addressed by its global index: its shard's first
index plus its row in the shard (shards in file order), which is also "input order": each
cluster keeps its smallest index.

Memory: signatures and filter hold one batch of text at a time; a bucket task holds one key
per document (8 bytes × documents, sorted); clusters holds a few int64 per document plus the
verification payload of the documents that share a bucket. No phase holds the corpus text.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from llmkit.data.dedup import unionfind
from llmkit.data.dedup.sketch import Sketcher
from llmkit.data.io import PART, DatasetWriter, dataset_files
from llmkit.errors import UserError
from llmkit.workspace import write_atomic

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
        return self._marker(phase, task).is_file()

    def pending(self, phase: str) -> list[int]:
        return [t for t in self.tasks(phase) if not self.done(phase, t)]

    def _info(self, phase: str, task: int) -> dict:
        return json.loads(self._marker(phase, task).read_text())

    def _complete(self, phase: str, task: int, info: dict) -> None:
        # renamed into place, not fsynced: a killed process leaves its writes in the page
        # cache, and tens of fsyncs per run cost more than the buckets phase itself
        marker = self._marker(phase, task)
        tmp = _temporary(marker)
        tmp.write_text(json.dumps(info))
        os.replace(tmp, marker)

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
        started = time.time()
        info = getattr(self, f"_{phase}")(task)
        info["seconds"] = round(time.time() - started, 3)
        self._complete(phase, task, info)

    # -- phase 1: signatures (one task per input shard) ----------------------------------
    def _signatures(self, shard: int) -> dict:
        pf = _open_parquet(self.shards[shard])
        if "text" not in pf.schema_arrow.names:
            raise UserError(f"{self.shards[shard]} has no 'text' column; dedup reads datasets "
                            "made by `llmkit ingest`/`clean`")
        n_rows = pf.metadata.num_rows
        final = self.work / "signatures" / f"part-{shard:05d}"
        tmp = _fresh(_temporary(final))
        keys = np.lib.format.open_memmap(tmp / "keys.npy", mode="w+", dtype=np.uint64,
                                         shape=(self.sketcher.n_keys, n_rows))
        lengths = np.zeros(n_rows, np.int64)
        pos = 0
        with open(tmp / "values.bin", "wb") as values:
            for batch in pf.iter_batches(batch_size=self.cfg.batch_rows, columns=["text"],
                                         use_threads=False):
                sketch = self.sketcher(batch.column(0))
                keys[:, pos:pos + batch.num_rows] = sketch.keys
                lengths[pos:pos + batch.num_rows] = sketch.lengths
                values.write(sketch.values.astype(self.sketcher.values_dtype,
                                                  copy=False).tobytes())
                pos += batch.num_rows
        keys.flush()
        del keys
        np.save(tmp / "lengths.npy", lengths)
        _replace_dir(tmp, final)
        return {"rows": n_rows}

    def shard_rows(self) -> np.ndarray:
        return np.array([self._info("signatures", s)["rows"] for s in range(len(self.shards))],
                        dtype=np.int64)

    # -- phase 2: buckets (one task per key row) -----------------------------------------
    def _buckets(self, key: int) -> dict:
        rows = [np.load(self.work / "signatures" / f"part-{s:05d}" / "keys.npy",
                        mmap_mode="r")[key] for s in range(len(self.shards))]
        column = np.concatenate(rows) if rows else np.zeros(0, np.uint64)
        members, offsets = unionfind.bucket_groups(column)
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
        values, value_offsets = self._candidate_payload(candidate, rows)
        parent = unionfind.new_parents(n)
        verified = accepted = 0
        for members, offsets in self._bucket_groups():
            v, a = unionfind.cluster_buckets(parent, members, offsets, self.sketcher.verify,
                                             values, value_offsets, self.sketcher.param)
            verified, accepted = verified + v, accepted + a
        del values, value_offsets, candidate
        root = unionfind.roots(parent)
        del parent
        self._write_removals(root, rows)
        stats = {"documents": n, "candidate_pairs_verified": verified,
                 "candidate_pairs_accepted": accepted, **cluster_stats(root)}
        write_atomic(self.work / "clusters" / "stats.json", json.dumps(stats))
        return stats

    def _candidate_payload(self, candidate: np.ndarray, rows: np.ndarray):
        """Verification payload of candidate documents only (others get an empty slice)."""
        lengths = np.zeros(len(candidate), np.int64)
        parts = []
        base = 0
        for s, n_rows in enumerate(rows):
            folder = self.work / "signatures" / f"part-{s:05d}"
            local = np.load(folder / "lengths.npy")
            wanted = candidate[base:base + n_rows]
            if wanted.any():
                dtype = self.sketcher.values_dtype
                stored = np.memmap(folder / "values.bin", dtype=dtype, mode="r") \
                    if local.sum() else np.zeros(0, dtype)
                starts = np.r_[0, np.cumsum(local)[:-1]][wanted]
                parts.append(unionfind.gather_ragged(stored, starts, local[wanted]))
                del stored
                lengths[base:base + n_rows][wanted] = local[wanted]
            base += n_rows
        values = (parts[0] if len(parts) == 1 else np.concatenate(parts)) if parts \
            else np.zeros(0, self.sketcher.values_dtype)
        return values, np.r_[0, np.cumsum(lengths)].astype(np.int64)

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
                ids.append(_id_column(self.shards[s]).cast(pa.string()).take(
                    _int64_array(local)))
        ids = pa.chunked_array(ids, pa.string())
        for s in range(len(rows)):
            lo, hi = np.searchsorted(removed, [bases[s], bases[s + 1]])
            kept_ids = ids.take(_int64_array(np.searchsorted(needed, kept_of_removed[lo:hi])))
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
            kept_w.write(table.filter(_bool_array(~drop)))
            gone = table.filter(_bool_array(drop))
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
                    _link_or_copy(f, dest / PART.format(counts[kind]))
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


def _open_parquet(path: Path):
    import pyarrow.parquet as pq

    # stream a column chunk page by page: by default pyarrow fetches the whole row group's
    # column at once, which for long documents is 100+ MB
    return pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)


def _id_column(path: Path):
    pf = _open_parquet(path)
    if "id" not in pf.schema_arrow.names:
        raise UserError(f"{path} has no 'id' column; dedup needs it to name the kept "
                        "document in duplicate_of")
    return pf.read(columns=["id"]).column("id").combine_chunks()


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


def _bool_array(mask: np.ndarray):
    import pyarrow as pa

    bits = np.packbits(mask, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(mask), [None, pa.py_buffer(bits)])


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


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:  # a filesystem without hard links
        shutil.copyfile(src, dest)


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _replace_dir(tmp: Path, final: Path) -> None:
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
