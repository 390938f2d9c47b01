import numpy as np
import pyarrow as pa
import pytest

from llmkit.data.dedup import phases
from llmkit.data.dedup.planted import planted_corpus
from llmkit.data.dedup.sketch import Sketcher, cluster_in_memory
from llmkit.data.dedup.stage import DedupConfig, run_dedup
from tests.data.dedup.conftest import make_dataset, predicted_clusters


@pytest.mark.parametrize("method", ["minhash", "simhash"])
def test_streamed_phases_cluster_as_the_whole_corpus_in_memory(make_ctx, ws, method,
                                                               monkeypatch):
    corpus = planted_corpus(40, unique=20, edit_rate=(0.01, 0.1), seed=5)
    make_dataset(ws, corpus.texts, parts=3)
    # tiny batches, payload blocks and verification chunks: every boundary gets crossed
    monkeypatch.setattr(phases, "_MEMBERS_AT_ONCE", 2)
    monkeypatch.setattr(phases, "_DOCS_AT_ONCE", 3)
    cfg = DedupConfig(method=method, batch_rows=7)
    b = run_dedup(make_ctx(), cfg)

    sketcher = Sketcher(cfg)
    roots, pairs = cluster_in_memory(sketcher(pa.array(corpus.texts)), sketcher)
    assert predicted_clusters(b.final, len(corpus)).tolist() == roots.tolist()
    assert b.stats["candidate_pairs_verified"] == pairs["pairs_verified"]
    assert 0 < b.stats["rows_removed"] < len(corpus)


def test_rows_are_picked_with_every_column_type_kept():
    table = pa.table({"id": ["a", "b", "c", "d"], "score": [1.0, None, 3.0, 4.0],
                      "tags": [["x"], [], None, ["y", "z"]]})
    picked = phases._rows_where(table, np.array([False, True, True, False]))
    assert picked.to_pylist() == table.slice(1, 2).to_pylist()
    assert picked.schema == table.schema and picked.column(0).num_chunks == 1
    assert phases._rows_where(table, np.ones(4, bool)) is table
    assert phases._rows_where(table, np.zeros(4, bool)).num_rows == 0


def test_strings_are_taken_from_any_string_array():
    ids = pa.array(["doc0", None, "", "doc3"], pa.large_string()).slice(1)
    taken = phases._take_strings(ids, np.array([2, 2, 0, 1]))
    assert taken.type == pa.string() and taken.to_pylist() == ["doc3", "doc3", "", ""]
