import pytest
import torch

import llmkit.model.packed_linear as packed
from llmkit.model import cpu_kernels, decode_step
from llmkit.model.decoding import generate, left_pad
from llmkit.model.packed_linear import packed_linears
from tests.model.test_transformer import build, tokens

needs_kernels = pytest.mark.skipif(not cpu_kernels.available(), reason="needs AVX-512 and a C++ compiler")


@pytest.fixture
def pack_every_matrix(monkeypatch):
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 1)  # the tiny model's matrices are all below the real bar


@needs_kernels
@pytest.mark.parametrize("overrides", [{}, {"attention_bias": True, "tie_embeddings": False}])
def test_the_direct_step_gives_the_modules_tokens_bit_for_bit(pack_every_matrix, monkeypatch, overrides):
    model = build(**overrides)
    ids, mask = left_pad([tokens(n, seed=n).tolist() for n in (3, 7, 5)], pad_id=0)
    with torch.no_grad(), packed_linears(model):
        assert decode_step.plan(model, torch.zeros(3, model.config.hidden_size)) is not None
        direct = generate(model, ids, max_new_tokens=10, temperature=1.0, attention_mask=mask,
                          generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(decode_step, "plan", lambda model, hidden: None)
    modules = generate(model, ids, max_new_tokens=10, temperature=1.0, attention_mask=mask,
                       generator=torch.Generator().manual_seed(0))
    assert torch.equal(direct, modules)


def test_models_the_direct_step_does_not_cover_keep_the_modules(pack_every_matrix):
    hidden = torch.zeros(1, 64)
    with torch.no_grad():
        for overrides in ({"qk_norm": True}, {"sliding_window": 8}):
            model = build(**overrides)
            with packed_linears(model):
                assert decode_step.plan(model, hidden) is None
        assert decode_step.plan(build(), hidden) is None  # not packed: the modules' own products
