import math

import numpy as np
import pytest
import torch

from llmkit.errors import ConfigError, UserError
from llmkit.eval.perplexity import (PerplexityConfig, split_documents, text_perplexity,
                                    token_split_perplexity)
from llmkit.eval.scoring import LMScorer
from tests.eval.conftest import EOS, write_tokens
from tests.train.posttrain_fixtures import make_tokenizer, tiny_model


def nll_of(model, ids) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, :-1]
    return -logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None]).sum().item()


@pytest.fixture
def val_docs():
    rng = np.random.default_rng(0)
    return [("web", rng.integers(4, 50, 20).tolist()), ("code", rng.integers(4, 50, 7).tolist()),
            ("web", rng.integers(4, 50, 12).tolist())]


def test_val_documents_are_read_after_the_previous_eos(tmp_path, val_docs):
    tokens = write_tokens(tmp_path, {"train": val_docs[:1], "val": val_docs})
    docs, sources, eos = split_documents(tokens, "val", limit=2)
    assert eos == EOS and sources == ["web", "code"]
    assert [d.tolist() for d in docs] == [[EOS, *ids, EOS] for _, ids in val_docs[:2]]


def test_token_split_perplexity_is_the_corpus_mean_over_documents_and_sources(tmp_path, val_docs, tok):
    model = tiny_model(50, seed=4).eval()
    tokens = write_tokens(tmp_path, {"val": val_docs})
    got = token_split_perplexity(LMScorer(model, device="cpu"), tok, tokens, PerplexityConfig())
    nll = [nll_of(model, [EOS, *ids, EOS]) for _, ids in val_docs]
    n = [len(ids) + 1 for _, ids in val_docs]  # every token and the closing </s>
    assert got["tokens"] == sum(n) and got["docs"] == 3
    assert got["ppl"] == pytest.approx(math.exp(sum(nll) / sum(n)), rel=1e-5)
    web = got["by_source"]["web"]
    assert web["ppl"] == pytest.approx(math.exp((nll[0] + nll[2]) / (n[0] + n[2])), rel=1e-5)
    assert got["by_source"]["code"]["docs"] == 1


def test_text_perplexity_tokenizes_and_reports_bits_per_byte(tok):
    model = tiny_model(tok.vocab_size, seed=5).eval()
    rows = [{"text": "What is 12+30? 42", "source": "a"}, {"text": "计算 11+11 等于 22", "source": "b"}]
    got = text_perplexity(LMScorer(model, device="cpu"), tok, rows, PerplexityConfig())
    seqs = [[tok.eos_id, *tok.encode(r["text"]), tok.eos_id] for r in rows]
    total = sum(nll_of(model, s) for s in seqs)
    n_bytes = sum(len(r["text"].encode()) for r in rows)
    assert got["tokens"] == sum(len(s) - 1 for s in seqs)
    assert got["bits_per_byte"] == pytest.approx(total / math.log(2) / n_bytes, rel=1e-5)
    assert set(got["by_source"]) == {"a", "b"}


def test_shards_of_another_tokenizer_are_refused(tmp_path, tok):
    tokens = write_tokens(tmp_path, {"val": [("web", [5, 6, 7])]})
    scorer = LMScorer(tiny_model(tok.vocab_size), device="cpu")
    tok.save(tokens / "tokenizer")
    assert token_split_perplexity(scorer, tok, tokens, PerplexityConfig())["tokens"] == 4
    make_tokenizer(tokens / "tokenizer", vocab_size=340)  # the shards say another one made them
    with pytest.raises(UserError, match="another tokenizer"):
        token_split_perplexity(scorer, tok, tokens, PerplexityConfig())


def test_stride_must_leave_context():
    with pytest.raises(ConfigError):
        PerplexityConfig(window=8, stride=8)
