import numpy as np
import pyarrow as pa

from llmkit.data.arrow import (int64_numpy, numbers, repeated_string, rows_where, set_column,
                               string_buffers, strings)


def test_string_buffers_read_sliced_arrays_and_nulls_as_empty():
    arr = pa.array(["skip me", "hello", None, "world"]).slice(1)
    data, offsets = string_buffers(arr)
    texts = [bytes(data[offsets[i]:offsets[i + 1]]).decode() for i in range(3)]
    assert texts == ["hello", "", "world"]
    data, offsets = string_buffers(["a", None, "中文"])
    assert bytes(data).decode() == "a中文" and offsets.tolist() == [0, 1, 1, 7]


def test_rows_are_picked_with_every_column_type_kept():
    table = pa.table({"id": ["a", "b", "c", "d"], "score": [1.0, None, 3.0, 4.0],
                      "tags": [["x"], [], None, ["y", "z"]]})
    picked = rows_where(table, np.array([False, True, True, False]))
    assert picked.to_pylist() == table.slice(1, 2).to_pylist()
    assert picked.schema == table.schema and picked.column(0).num_chunks == 1
    assert rows_where(table, np.ones(4, bool)) is table
    assert rows_where(table, np.zeros(4, bool)).num_rows == 0


def test_arrays_from_buffers_equal_pyarrows_own():
    assert strings(["x", "", "ü"]).equals(pa.array(["x", "", "ü"], pa.string()))
    assert repeated_string("ab", 3).equals(pa.array(["ab"] * 3, pa.string()))
    assert numbers(np.arange(3, dtype=np.int64)).equals(pa.array([0, 1, 2], pa.int64()))
    column = pa.chunked_array([pa.array([5, 6, 7], pa.int64()).slice(1), pa.array([8], pa.int64())])
    assert int64_numpy(column).tolist() == [6, 7, 8]
    table = set_column(pa.table({"a": [1]}), "b", pa.array(["x"]))
    assert set_column(table, "a", pa.array([2])).to_pylist() == [{"a": 2, "b": "x"}]
