import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from llmkit.core import aot
from llmkit.data.dedup import compiled
from llmkit.data.dedup.planted import planted_corpus
from llmkit.data.dedup.sketch import Sketcher, cluster_in_memory
from llmkit.data.dedup.stage import DedupConfig


@pytest.mark.parametrize("method", ["exact", "simhash", "minhash"])
def test_the_jit_fallback_gives_the_compiled_sketches_and_clusters(method, monkeypatch):
    corpus = planted_corpus(30, unique=20, seed=3)
    texts = pa.array(corpus.texts + ["中文 文本 中文文本", ""])
    sketcher = Sketcher(DedupConfig(method=method))

    def run():
        sketch = sketcher(texts)
        return sketch, cluster_in_memory(sketch, sketcher)

    assert compiled.kernels().__file__.endswith(".so") and compiled.cluster_kernels().__file__.endswith(".so")
    want, (want_roots, want_pairs) = run()
    monkeypatch.setattr(compiled, "_KERNELS", aot.just_in_time("llmkit.data.dedup._kernels"))
    monkeypatch.setattr(compiled, "_CLUSTER_KERNELS", aot.just_in_time("llmkit.data.dedup._cluster_kernels"))
    got, (roots, pairs) = run()
    assert np.array_equal(got.keys, want.keys) and np.array_equal(got.values, want.values)
    assert np.array_equal(roots, want_roots) and pairs == want_pairs
    assert len(np.unique(roots)) < len(texts)  # the planted copies were found


def test_a_dedup_process_never_imports_numba():
    code = ("import sys, pyarrow as pa\n"
            "from llmkit.data.dedup.sketch import Sketcher, cluster_in_memory\n"
            "from llmkit.data.dedup.stage import DedupConfig\n"
            "s = Sketcher(DedupConfig())\n"
            "roots, _ = cluster_in_memory(s(pa.array(['a b c d', 'a b c d', 'e f'])), s)\n"
            "print(roots.tolist(), 'numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("]")
    assert out[0] == "[0, 0, 2" and out[1].strip() == "False"
