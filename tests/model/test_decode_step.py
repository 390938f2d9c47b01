import copy

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


def steps_checked_against_the_modules(monkeypatch) -> list[bool]:
    """Every direct step of a generation is also run through the modules on a copy of the cache: one
    bool per step, whether the hidden states and the caches they leave are equal bit for bit."""
    checked, direct_step = [], decode_step.step_hidden

    def both(model, plan, input_ids, position_ids, kv_cache, attention_mask):
        other = copy.deepcopy(kv_cache)
        direct = direct_step(model, plan, input_ids, position_ids, kv_cache, attention_mask)
        modules = model.hidden_states(input_ids, position_ids, kv_cache=other, attention_mask=attention_mask)
        checked.append(torch.equal(direct, modules) and other.length == kv_cache.length
                       and all(torch.equal(x, y) for x, y in zip(kv_cache.k + kv_cache.v, other.k + other.v)))
        return direct

    monkeypatch.setattr(decode_step, "step_hidden", both)
    return checked


@needs_kernels
@pytest.mark.parametrize("overrides", [{}, {"attention_bias": True, "tie_embeddings": False}])
def test_the_direct_step_gives_the_modules_hidden_states_bit_for_bit(pack_every_matrix, monkeypatch, overrides):
    model = build(**overrides)
    ids, mask = left_pad([tokens(n, seed=n).tolist() for n in (3, 7, 5)], pad_id=0)
    checked = steps_checked_against_the_modules(monkeypatch)
    with torch.no_grad(), packed_linears(model):
        assert decode_step.plan(model, torch.zeros(3, model.config.hidden_size)) is not None
        generate(model, ids, max_new_tokens=10, temperature=1.0, attention_mask=mask,
                 generator=torch.Generator().manual_seed(0))
    assert checked == [True] * 9


@pytest.mark.parametrize("weights", [
    pytest.param(k, marks=pytest.mark.skipif(not cpu_kernels.low_precision_available(k), reason=f"needs the {k} kernels"))
    for k in ("bf16", "f16", "int8")])
def test_the_direct_step_through_low_precision_weights_is_the_modules_bit_for_bit(pack_every_matrix, monkeypatch,
                                                                                   weights):
    """One call for every layer (llmkit_decode_layers) passes each layer's own product kernel."""
    from llmkit.model.decode_weights import decoding_weights

    model = build(seed=2)
    ids = tokens(6, seed=4)[None]  # batch 1, no mask: the chat case
    checked = steps_checked_against_the_modules(monkeypatch)
    with torch.no_grad(), decoding_weights(model, weights):
        assert decode_step.plan(model, torch.zeros(1, model.config.hidden_size)) is not None
        generate(model, ids, max_new_tokens=8, greedy=True)
    assert checked == [True] * 7


def test_models_the_direct_step_does_not_cover_keep_the_modules(pack_every_matrix):
    hidden = torch.zeros(1, 64)
    with torch.no_grad():
        for overrides in ({"qk_norm": True}, {"sliding_window": 8}):
            model = build(**overrides)
            with packed_linears(model):
                assert decode_step.plan(model, hidden) is None
        assert decode_step.plan(build(), hidden) is None  # not packed: the modules' own products
