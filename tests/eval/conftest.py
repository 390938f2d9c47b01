"""Fixtures of the eval tests: a tiny tokenizer, language models whose predictions we set, and
token shards of given texts."""

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
import torch
import torch.nn as nn
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.io import DatasetWriter
from llmkit.core.workspace import Workspace
from tests.train.posttrain_fixtures import make_tokenizer


@pytest.fixture(scope="package")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


class UnigramLM(nn.Module):
    """Predicts the same distribution softmax(logits) after every context: the log-likelihood of a
    continuation is the sum of log p(token) of its tokens, whatever came before."""

    def __init__(self, logits: torch.Tensor, max_seq_len: int = 256):
        super().__init__()
        self.config = SimpleNamespace(max_seq_len=max_seq_len, vocab_size=len(logits))
        self.lm_head = nn.Linear(1, len(logits))
        with torch.no_grad():
            self.lm_head.weight.zero_()
            self.lm_head.bias.copy_(logits)

    def hidden_states(self, input_ids, *args, **kwargs):
        return torch.ones(*input_ids.shape, 1, device=input_ids.device)

    def logprob(self, token: int) -> float:
        return self.lm_head.bias.log_softmax(-1)[token].item()


def tokenize_rows(root: Path, tok, rows: list[dict], val_fraction: float) -> Path:
    """`tokens` made by `llmkit tokenize` from a dataset of `rows` and the tokenizer `tok`."""
    b = Workspace(root).builder("tokenizer", stage="tokenizer", config={}, quiet=True)
    with b:
        tok.save(b.dir)
    b = Workspace(root).builder("docs", stage="ingest", config={}, quiet=True)
    with b:
        writer = DatasetWriter(b.dir)
        writer.write(pa.Table.from_pylist(rows))
        writer.close()
    r = CliRunner().invoke(build_app(), ["tokenize", "-w", str(root), "--in", "docs",
                                         "--set", f"val_fraction={val_fraction}"])
    assert r.exit_code == 0, r.output
    return root / "tokens"
