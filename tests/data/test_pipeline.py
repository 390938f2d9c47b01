from collections import Counter

import pyarrow as pa
import pytest

from llmkit.data.io import dataset_files, read_table
from llmkit.data.pipeline import RowCounts, SplitWriter, link_task_outputs


def rows(ids, reason=None):
    table = pa.table({"id": ids, "text": [f"text of {i}" for i in ids]})
    return table.append_column("reason", pa.array([reason] * len(ids), pa.string())) \
        if reason else table


def test_split_writer_writes_kept_and_removed_rows_and_counts_them(tmp_path):
    writer = SplitWriter.into(tmp_path / "out")
    writer.write(rows(["a", "b"]), rows(["c"], "too_short"))
    writer.write(rows(["d"]), rows(["e", "f"], "gibberish"))
    counts = writer.close(6, "clean")
    assert counts.stats() == {"rows_in": 6, "rows_out": 3, "rows_removed": 3,
                              "removed_by_reason": {"gibberish": 2, "too_short": 1}}
    assert counts.first_removed == "id 'c'"
    assert read_table(tmp_path / "out").column("id").to_pylist() == ["a", "b", "d"]
    assert read_table(tmp_path / "out" / "removed").column("reason").to_pylist() == [
        "too_short", "gibberish", "gibberish"]


def test_rows_not_written_break_conservation(tmp_path):
    writer = SplitWriter.into(tmp_path / "out")
    writer.write(rows(["a"]), rows(["b"], "too_short"))
    with pytest.raises(AssertionError, match="rows_in 3 != 1 \\+ 1"):
        writer.close(3, "clean")


def test_task_outputs_add_up_and_link_into_one_dataset(tmp_path):
    counts = RowCounts()
    for task, (kept, gone) in enumerate([(["a", "b"], ["c"]), ([], ["d"]), (["e"], [])]):
        writer = SplitWriter.task_layout(tmp_path / f"task{task}")
        writer.write(rows(kept), rows(gone, "dup"), reasons={"dup": len(gone)})
        counts += writer.close(len(kept) + len(gone), "dedup")
    assert counts == RowCounts(5, 3, 2, Counter(dup=2), "id 'c'")
    link_task_outputs([tmp_path / f"task{t}" for t in range(3)], tmp_path / "out", "dedup")
    assert [f.name for f in dataset_files(tmp_path / "out")] == ["part-00000.parquet",
                                                                 "part-00001.parquet"]
    assert read_table(tmp_path / "out").column("id").to_pylist() == ["a", "b", "e"]
    assert read_table(tmp_path / "out" / "removed").column("id").to_pylist() == ["c", "d"]
