import math

import numpy as np
import pytest
import torch

from llmkit.data.tokenize import val_mask
from llmkit.errors import ConfigError, UserError
from llmkit.eval.perplexity import (PerplexityConfig, split_documents, text_perplexity,
                                    token_split_perplexity)
from llmkit.model.lm_scoring import LMScorer
from tests.eval.conftest import tokenize_rows
from tests.train.posttrain_fixtures import make_tokenizer, task_sentences, tiny_model

ROWS = [{"id": f"d{i}", "text": t, "source": "zh" if "计算" in t else "en"}
        for i, t in enumerate(task_sentences(10, seed=3))]


def nll_of(model, ids) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, :-1]
    return -logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None]).sum().item()


@pytest.fixture(scope="module")
def tokens(tmp_path_factory, tok):
    return tokenize_rows(tmp_path_factory.mktemp("ppl"), tok, ROWS, val_fraction=0.5)


@pytest.fixture(scope="module")
def val_rows():
    in_val = val_mask([r["id"] for r in ROWS], 0.5, 0)
    return [r for r, v in zip(ROWS, in_val) if v]


def test_val_documents_are_read_after_the_previous_eos(tokens, val_rows, tok):
    docs, sources, eos = split_documents(tokens, "val", limit=3)
    assert eos == tok.eos_id and sources == [r["source"] for r in val_rows[:3]]
    assert [d.tolist() for d in docs] == [[eos, *tok.encode(r["text"]), eos] for r in val_rows[:3]]


def test_token_split_perplexity_is_the_corpus_mean_over_documents_and_sources(tokens, val_rows, tok):
    model = tiny_model(tok.vocab_size, seed=4).eval()
    got = token_split_perplexity(LMScorer(model, device="cpu"), tok, tokens, PerplexityConfig())
    seqs = [[tok.eos_id, *tok.encode(r["text"]), tok.eos_id] for r in val_rows]
    nll = [nll_of(model, s) for s in seqs]
    n = [len(s) - 1 for s in seqs]  # every text token and the closing </s>
    assert got["tokens"] == sum(n) and got["docs"] == len(val_rows) >= 4
    assert got["ppl"] == pytest.approx(math.exp(sum(nll) / sum(n)), rel=1e-5)
    en = [i for i, r in enumerate(val_rows) if r["source"] == "en"]
    assert got["by_source"]["en"]["ppl"] == pytest.approx(
        math.exp(sum(nll[i] for i in en) / sum(n[i] for i in en)), rel=1e-5)


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
    other = make_tokenizer(tmp_path / "other", vocab_size=340)
    tokens = tokenize_rows(tmp_path / "ws", other, ROWS, val_fraction=0.5)
    with pytest.raises(UserError, match="another tokenizer"):
        token_split_perplexity(LMScorer(tiny_model(tok.vocab_size), device="cpu"), tok, tokens,
                               PerplexityConfig())


def test_stride_must_leave_context():
    with pytest.raises(ConfigError):
        PerplexityConfig(window=8, stride=8)


def test_generate_eval_and_ppl_filter_start_plain_text_alike(tok, monkeypatch):
    """One convention for plain text before a pretrained model (Tokenizer.document_start_ids):
    the </s> that ended the document before, as in the token shards — never <s>."""
    import llmkit.model.decoding
    from llmkit.generation import GenerateConfig, generate_texts
    from llmkit.data.ppl_filter import ModelScorer, PplFilterConfig
    from llmkit.eval.choice import continuation_requests
    from llmkit.eval.generation import prompt_ids
    from llmkit.eval.perplexity import text_documents

    text = "What is 12+34?"
    expected = [tok.eos_id, *tok.encode(text)]
    assert tok.document_start_ids() == [tok.eos_id] != [tok.bos_id]
    model = tiny_model(tok.vocab_size).eval()
    seen = {}

    def fake_generate(model, ids, max_new_tokens, **kw):
        seen["generate"] = ids[0].tolist()
        return torch.cat([ids, torch.full((len(ids), max_new_tokens), tok.eos_id)], 1)

    monkeypatch.setattr(llmkit.model.decoding, "generate", fake_generate)
    generate_texts(model, tok, [text], GenerateConfig(max_new_tokens=2, chat=False))

    def fake_document_nll(self, docs, window, stride):
        seen["ppl-filter"] = [list(d) for d in docs]
        return np.zeros(len(docs)), np.ones(len(docs), np.int64)

    monkeypatch.setattr(LMScorer, "document_nll", fake_document_nll)
    ModelScorer(model, tok, PplFilterConfig(device="cpu")).score([text])

    [(choice_ids, n_cont)] = continuation_requests(tok, text, [" 46"], 128)
    assert seen["generate"] == expected
    assert prompt_ids(tok, {"prompt": text}, False, "row 1") == expected
    assert choice_ids[:-n_cont] == expected
    assert text_documents(tok, [text]) == [[*expected, tok.eos_id]] == seen["ppl-filter"]
