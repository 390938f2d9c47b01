"""Arrow arrays and tables made from numpy buffers, and numpy views of Arrow's.

The data stages' hot loops stay clear of `pyarrow.compute` (loading its kernels adds ~8 MB to
a process) and of converting Python or numpy objects (pyarrow imports pandas, ~0.5 s, the
first time it does), so arrays are built from and read as their buffers.
"""

from __future__ import annotations

import numpy as np


def string_buffers(texts) -> tuple[np.ndarray, np.ndarray]:
    """(UTF-8 bytes as uint8, offsets as int64) of an arrow string column (or a list of str):
    row i is data[offsets[i]:offsets[i + 1]]. Zero-copy for an arrow array (offsets are
    into its whole data buffer, so they need not start at 0); nulls read as empty strings."""
    import pyarrow as pa

    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    if not isinstance(texts, pa.Array):
        texts = strings(["" if t is None else t for t in texts])
    if pa.types.is_large_string(texts.type):
        offset_type = np.int64
    elif pa.types.is_string(texts.type):
        offset_type = np.int32
    else:
        raise TypeError(f"expected a string column, got {texts.type}")
    n = len(texts)
    if n == 0:
        return np.zeros(0, np.uint8), np.zeros(1, np.int64)
    if texts.null_count:
        texts = texts.fill_null("")
    buffers = texts.buffers()
    offsets = np.frombuffer(buffers[1], offset_type)[texts.offset:texts.offset + n + 1]
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return data, offsets.astype(np.int64)


def strings(values: list[str]):
    """An arrow string array of `values`."""
    import pyarrow as pa

    encoded = [v.encode("utf-8", "surrogatepass") for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(encoded),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def repeated_string(value: str, n: int):
    """An arrow string array of `value`, `n` times."""
    import pyarrow as pa

    data = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(data * n)])


def numbers(values):
    """An arrow array viewing a numpy array (of a fixed-width type)."""
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values),
                                 [None, pa.py_buffer(values)])


def int64_numpy(column) -> np.ndarray:
    """An int64 arrow column (without nulls) as a numpy array."""
    array = column.combine_chunks()
    if len(array) == 0:
        return np.zeros(0, np.int64)
    return np.frombuffer(array.buffers()[1], np.int64)[array.offset:array.offset + len(array)]


def rows_where(table, mask: np.ndarray):
    """The rows of `table` where `mask` is set, as one table of single-chunk columns."""
    import pyarrow as pa

    edges = np.flatnonzero(np.diff(np.r_[0, mask.view(np.int8), 0]))
    runs = [table.slice(a, b - a) for a, b in zip(edges[::2].tolist(), edges[1::2].tolist())]
    if len(runs) == 1 and runs[0].num_rows == table.num_rows:
        return table
    return pa.concat_tables(runs).combine_chunks() if runs else table.slice(0, 0)


def set_column(table, name: str, values):
    """`table` with column `name` replaced by `values`, or appended where it has none."""
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, values)
    return table.append_column(name, values)
