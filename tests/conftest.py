import json
import os
from pathlib import Path

# `make test` runs one pytest-xdist worker per core: each worker, and the processes it starts,
# computes on one thread, or the workers' thread pools would fight over the same cores
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest

from llmkit.core.context import StageContext


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """A small sentencepiece tokenizer trained on the tests' task sentences (one per module)."""
    from tests.train.posttrain_fixtures import make_tokenizer

    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module of tiny models: with tiny matrices a second thread only
    adds synchronisation, and on a busy machine a lot of it (`pytestmark = usefixtures(...)`)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def ws(tmp_path) -> Path:
    return tmp_path / "ws"


@pytest.fixture
def make_ctx(ws):
    def make(**kw):
        return StageContext.create(workspace=ws, **kw)

    return make


def write_jsonl(path: Path, records, raw_lines=()) -> Path:
    """Records as JSON lines, then raw (possibly broken) lines verbatim."""
    with open(path, "wb") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False).encode() + b"\n")
        for line in raw_lines:
            f.write(line + b"\n")
    return path
