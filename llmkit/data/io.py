"""Dataset files: parquet parts (`part-00000.parquet …`, zstd) read and written in record
batches, files of a task built under a temporary name, and the one JSONL reader (records with
their line numbers)."""

from __future__ import annotations

import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from llmkit.errors import UserError

PARTS = "part-*.parquet"  # the glob of a dataset's part files
BYTES_PER_GROUP = 64 << 20  # DESIGN: row groups of ~64 MB
BYTES_PER_PART = 256 << 20  # roll to a new part file past this many bytes of text


class DatasetWriter:
    """Appends tables to numbered parquet parts; opens nothing until the first row."""

    def __init__(self, directory: Path, *, bytes_per_part: int = BYTES_PER_PART):
        self.dir = Path(directory)
        self.bytes_per_part = bytes_per_part
        self.rows = 0
        self._writer = None
        self._schema = None
        self._part = 0
        self._part_bytes = 0

    def write(self, table) -> None:
        import pyarrow.parquet as pq

        import pyarrow as pa

        if table.num_rows == 0:
            return
        if self._schema is not None and not table.schema.equals(self._schema):
            merged = pa.unify_schemas([self._schema, table.schema], promote_options="permissive")
            if not merged.equals(self._schema):
                # a new column (or a typed one that was all-null so far): start a new part,
                # since a parquet file has one schema
                self._roll()
                self._schema = merged
            table = _conform(table, self._schema)
        if self._writer is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._schema = self._schema or table.schema
            self._writer = pq.ParquetWriter(part_path(self.dir, self._part), self._schema,
                                            compression="zstd")
        bytes_per_row = max(1, table.nbytes // table.num_rows)
        self._writer.write_table(table, row_group_size=max(1, BYTES_PER_GROUP // bytes_per_row))
        self.rows += table.num_rows
        self._part_bytes += table.nbytes
        if self._part_bytes >= self.bytes_per_part:
            self._roll()

    def _roll(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer, self._part_bytes = None, 0
            self._part += 1

    def close(self) -> int:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        return self.rows


def _conform(table, schema):
    """Cast a table to the writer's schema (a column that is all-null here may be typed null)."""
    import pyarrow as pa

    cols = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def part_path(directory: Path, index: int, suffix: str = ".parquet") -> Path:
    """`directory/part-00003.parquet`: the one spelling of a numbered part, be it a dataset's
    parquet file or (with another `suffix`) a task's folder or marker named after its shard."""
    return Path(directory) / f"part-{index:05d}{suffix}"


def dataset_files(path: Path) -> list[Path]:
    return sorted(Path(path).glob(PARTS))


def open_parquet(path: Path):
    """A parquet file to stream: a column chunk is read page by page, where by default pyarrow
    fetches a whole row group's column at once (100+ MB for long documents)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)


def iter_batches(path: Path, columns: list[str] | None = None,
                 batch_size: int = 8192) -> Iterator:
    """Record batches of every part in order; memory stays at one batch."""
    for f in dataset_files(path):
        yield from open_parquet(f).iter_batches(batch_size=batch_size, columns=columns,
                                                use_threads=False)


def part_rows(part: Path) -> int:
    """The rows of one parquet file, from its metadata."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(part).metadata.num_rows


def count_rows(path: Path) -> int:
    return sum(map(part_rows, dataset_files(path)))


def read_table(path: Path, columns: list[str] | None = None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = dataset_files(path)
    if not files:
        return pa.table({c: pa.array([], pa.string()) for c in (columns or ["id", "text"])})
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in files],
                            promote_options="default")


# -- a task's files: built under a temporary name, then put in place -------------------------

def temporary_path(final: Path) -> Path:
    """Where to build `final`: per process, so two runs that wrongly share a task never write
    into one file."""
    return final.with_name(f"{final.name}.tmp-{os.getpid()}")


def fresh_dir(path: Path) -> Path:
    """`path` as a new empty folder (what a killed run left there is gone)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def replace_dir(tmp: Path, final: Path) -> None:
    """Put the folder built at `tmp` in place of `final` (and of whatever was there)."""
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)


# -- JSONL ----------------------------------------------------------------------------------

MAX_REMOVED_TEXT = 100_000  # keep quarantined raw text, but not a whole binary file


@dataclass
class BadRecord:
    """A record that could not be read: why (`invalid_utf8`, `malformed_json`, …), its raw
    text (what could be decoded) and the parser's words."""
    reason: str
    raw: str = ""
    detail: str = ""


def open_binary(path: Path):
    """A file opened for bytes, `.gz` / `.zst` decompressed as it is read."""
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        import gzip

        return gzip.open(path, "rb")
    if name.endswith(".zst"):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")))
    return open(path, "rb")


def decode_text(data: bytes, encoding: str) -> str | BadRecord:
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        hint = "invalid_utf8" if encoding == "utf-8" else f"invalid_{encoding}"
        return BadRecord(hint, data[:MAX_REMOVED_TEXT].decode(encoding, errors="replace"), str(e))


def read_jsonl(path: Path, *, encoding: str = "utf-8",
               strict: bool = True) -> Iterator[tuple[int, object]]:
    """(line number, record) for each non-blank line of a JSONL file (`.gz`/`.zst` too).

    A line that is not `encoding` text or not JSON raises a UserError naming `file:line` when
    `strict`; otherwise it comes as (line number, BadRecord), for a caller that quarantines
    bad lines and goes on. A file that cannot be opened raises its OSError."""
    with open_binary(path) as f:
        for n, line in enumerate(f, 1):
            record = _json_record(decode_text(line, encoding))
            if record is _BLANK:
                continue
            if strict and isinstance(record, BadRecord):
                what = "JSON" if record.reason == "malformed_json" else f"{encoding} text"
                raise UserError(f"{path}:{n}: not valid {what} ({record.detail})")
            yield n, record


_BLANK = object()  # a blank line is not a record


def _json_record(text: str | BadRecord):
    if isinstance(text, BadRecord):
        return text
    if not text.strip():
        return _BLANK
    try:
        return json.loads(text)
    except ValueError as e:
        return BadRecord("malformed_json", text, str(e))
