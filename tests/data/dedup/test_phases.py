import numpy as np
import pyarrow as pa
import pytest

from llmkit.data.dedup.phases import clusters
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
    monkeypatch.setattr(clusters, "_MEMBERS_AT_ONCE", 2)
    monkeypatch.setattr(clusters, "_DOCS_AT_ONCE", 3)
    cfg = DedupConfig(method=method, batch_rows=7)
    b = run_dedup(make_ctx(), cfg)

    sketcher = Sketcher(cfg)
    roots, pairs = cluster_in_memory(sketcher(pa.array(corpus.texts)), sketcher)
    assert predicted_clusters(b.final, len(corpus)).tolist() == roots.tolist()
    assert b.stats["candidate_pairs_verified"] == pairs["pairs_verified"]
    assert 0 < b.stats["rows_removed"] < len(corpus)


def test_strings_are_taken_from_any_string_array():
    ids = pa.array(["doc0", None, "", "doc3"], pa.large_string()).slice(1)
    taken = clusters.take_strings(ids, np.array([2, 2, 0, 1]))
    assert taken.type == pa.string() and taken.to_pylist() == ["doc3", "doc3", "", ""]
