import numpy as np
import pytest
import torch

from llmkit.errors import ConfigError
from llmkit.model import lm_scoring
from llmkit.model.lm_scoring import LMScorer, windows
from tests.train.posttrain_fixtures import tiny_model


def full_logprobs(model, ids) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t ≥ 1, from one unbatched forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, :-1]
    return logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)


@pytest.mark.parametrize("head_rows", [None, 3])
def test_batched_requests_equal_one_forward_pass_each(head_rows, monkeypatch):
    if head_rows:  # the LM head in slices of 3 positions
        monkeypatch.setattr(lm_scoring, "HEAD_ELEMENTS", 50 * head_rows)
    model = tiny_model(50, seed=1).eval()
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 50, n).tolist() for n in (3, 17, 9, 30, 2, 12)]
    requests = [(s, k) for s, k in zip(seqs, (1, 5, 8, 29, 1, 4))]
    # 40 tokens per pass: several batches, each right-padded to its longest
    got = LMScorer(model, device="cpu", batch_tokens=40).target_logprobs(requests)
    want = [full_logprobs(model, s)[-k:].sum().item() for s, k in requests]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_request_that_does_not_fit_the_model_is_refused():
    scorer = LMScorer(tiny_model(50, max_seq_len=16), device="cpu")
    with pytest.raises(ValueError):
        scorer.target_logprobs([(list(range(17)), 1)])
    with pytest.raises(ValueError):
        scorer.target_logprobs([([1, 2, 3], 3)])  # the first token has no context to predict it


@pytest.mark.parametrize("n,window,stride", [(2, 4, 2), (10, 4, 2), (11, 5, 3), (9, 3, 2), (40, 8, 1), (40, 8, 7)])
def test_windows_predict_every_token_once_with_enough_context(n, window, stride):
    predicted = []
    for k, (begin, end, targets) in enumerate(windows(n, window, stride)):
        assert end - begin <= window and 1 <= targets < end - begin  # ≥ 1 token of context
        first = end - targets
        if k:  # after the first piece each prediction sees ≥ window - stride tokens
            assert first - begin >= window - stride
        predicted += range(first, end)
    assert predicted == list(range(1, n))


def position_free(model):
    """The model with attention switched off: each prediction depends on the current token only,
    so scoring in windows must give exactly the one-pass log-likelihood."""
    with torch.no_grad():
        for block in model.model.layers:
            block.self_attn.o_proj.weight.zero_()
    return model


def test_sliding_window_counts_each_token_once():
    model = position_free(tiny_model(50, seed=2, max_seq_len=64)).eval()
    docs = [np.random.default_rng(i).integers(0, 50, n).tolist() for i, n in enumerate((60, 7, 1, 33))]
    scorer = LMScorer(model, device="cpu", batch_tokens=64)
    whole_nll, whole_n = scorer.document_nll(docs)
    win_nll, win_n = scorer.document_nll(docs, window=8, stride=3)
    assert whole_n.tolist() == win_n.tolist() == [59, 6, 0, 32]
    np.testing.assert_allclose(win_nll, whole_nll, rtol=1e-5)
    np.testing.assert_allclose(whole_nll[0], -full_logprobs(model, docs[0]).sum().item(), rtol=1e-5)


def test_windowed_scoring_of_a_real_model_differs_only_by_lost_context():
    model = tiny_model(50, seed=3, max_seq_len=64).eval()
    doc = np.random.default_rng(5).integers(0, 50, 64).tolist()
    scorer = LMScorer(model, device="cpu")
    whole, n = scorer.document_nll([doc])
    windowed, m = scorer.document_nll([doc], window=16, stride=8)
    assert n == m == 63
    assert windowed[0] != pytest.approx(whole[0], rel=1e-6)


def test_bad_scoring_settings_are_config_errors():
    with pytest.raises(ConfigError):
        LMScorer(tiny_model(50), device="cpu", dtype="float8")
    with pytest.raises(ConfigError):
        LMScorer(tiny_model(50), device="cpu").document_nll([[1, 2, 3]], window=4, stride=5)
