"""Fixtures of the eval tests: a tiny tokenizer, language models whose predictions we set, and a
token artifact written by hand."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn as nn

from llmkit.workspace import Workspace
from tests.train.posttrain_fixtures import make_tokenizer

EOS = 2  # the fixture tokenizer's </s>


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


def write_tokens(root, docs_by_split: dict) -> Path:
    """A token artifact as `llmkit tokenize` writes it: each document followed by </s>."""
    b = Workspace(root).builder("tokens", stage="tokenize", config={}, quiet=True)
    with b:
        for split, docs in docs_by_split.items():
            (b.dir / split).mkdir()
            flat, index, offset = [], {"id": [], "source": [], "offset": [], "length": []}, 0
            for i, (source, ids) in enumerate(docs):
                flat += [*ids, EOS]
                index["id"].append(f"{split}{i}")
                index["source"].append(source)
                index["offset"].append(offset)
                index["length"].append(len(ids) + 1)
                offset += len(ids) + 1
            np.array(flat, np.uint16).tofile(b.dir / split / "shard-00000.bin")
            pq.write_table(pa.table(index), b.dir / split / "shard-00000.parquet")
        b.stats.update(dtype="uint16", eos_id=EOS, vocab_size=50)
    return b.final
