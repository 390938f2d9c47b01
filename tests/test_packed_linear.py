import pytest
import torch
import torch.nn as nn

import llmkit.packed_linear as packed
from llmkit.decoding import generate
from llmkit.packed_linear import PACKED, packed_linears
from tests.test_model import build, tokens


@pytest.fixture
def pack_every_matrix(monkeypatch):
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 1)  # the tiny model's matrices are all below the real bar


def linears(model):
    return [m for m in model.modules() if type(m) is nn.Linear]


def test_packed_layers_compute_what_linear_computes_and_are_restored_after(pack_every_matrix):
    model = build(tie_embeddings=False, attention_bias=True)
    x = tokens(3, 7)
    with torch.no_grad():
        plain = model(x)
        with packed_linears(model):
            assert all(hasattr(m, PACKED) and "forward" in vars(m) for m in linears(model))
            assert torch.allclose(model(x), plain, atol=1e-5, rtol=1e-5)
    assert not any(hasattr(m, PACKED) or "forward" in vars(m) for m in linears(model))
    with torch.no_grad():
        assert torch.equal(model(x), plain)


def test_greedy_generation_is_the_same_packed_or_not(pack_every_matrix, monkeypatch):
    model, prompts = build(), tokens(4, 5)
    with_packing = generate(model, prompts, max_new_tokens=12, greedy=True)
    monkeypatch.setenv("LLMKIT_PACKED_LINEAR", "0")
    assert torch.equal(generate(model, prompts, max_new_tokens=12, greedy=True), with_packing)


def test_nested_uses_pack_once_and_the_outer_one_restores(pack_every_matrix):
    model = build()
    layer = linears(model)[0]
    with packed_linears(model):
        first = getattr(layer, PACKED)
        with packed_linears(model):
            assert getattr(layer, PACKED) is first
        assert getattr(layer, PACKED) is first  # the inner exit left the outer's packing in place
    assert not hasattr(layer, PACKED)


class QuantisedLinear(nn.Linear):
    """Stands for bitsandbytes' Linear4bit/Linear8bitLt, which subclass nn.Linear."""


def test_what_cannot_be_packed_is_left_alone(pack_every_matrix, monkeypatch):
    model = nn.Sequential(QuantisedLinear(8, 8), nn.Linear(8, 8).double(), nn.Linear(8, 8))
    with packed_linears(model):
        assert [hasattr(m, PACKED) for m in model] == [False, False, True]
    with torch.autocast("cpu", dtype=torch.bfloat16), packed_linears(model):
        assert not any(hasattr(m, PACKED) for m in model)  # autocast casts per op: packing would skip it
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 65)
    with packed_linears(model):
        assert not any(hasattr(m, PACKED) for m in model)  # 8 x 8 is below the bar


def test_a_layer_that_needs_gradients_computes_them_as_linear_does(pack_every_matrix):
    layer = nn.Linear(6, 5)
    x = torch.randn(4, 6, requires_grad=True)
    layer(x).square().sum().backward()
    expected = layer.weight.grad.clone(), x.grad.clone()
    layer.weight.grad = x.grad = None
    with packed_linears(layer):
        layer(x).square().sum().backward()
    assert torch.equal(layer.weight.grad, expected[0]) and torch.equal(x.grad, expected[1])


def test_frozen_layers_train_through_packed_weights_and_give_the_same_gradients(pack_every_matrix):
    # a LoRA-like run: the frozen layer's product and the input's gradient go through packed W and
    # W^T; the trained layer keeps F.linear (it needs its weight's gradient) and is not packed
    frozen, trained = nn.Linear(6, 5), nn.Linear(5, 4)
    frozen.requires_grad_(False)
    model = nn.Sequential(trained, nn.Tanh(), nn.Linear(4, 6), frozen)
    model[2].requires_grad_(False)
    x = torch.randn(3, 7, 5)

    def grads():
        model.zero_grad()
        model(x).square().sum().backward()
        return [p.grad.clone() for p in trained.parameters()]

    expected = grads()
    with torch.no_grad():
        plain = model(x)
    with packed_linears(model, frozen_only=True):
        assert [hasattr(m, packed.PACKED_T) for m in (trained, model[2], frozen)] == [False, True, True]
        got = grads()
        with torch.no_grad():
            torch.testing.assert_close(model(x), plain, atol=1e-5, rtol=1e-5)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    assert frozen.weight.grad is None and not hasattr(frozen, packed.PACKED_T)
    with packed_linears(model, frozen_only=True), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x).dtype == torch.bfloat16  # autocast (bf16 training) after packing: F.linear again


def test_training_packs_only_while_the_copies_fit_in_a_share_of_the_memory(pack_every_matrix, monkeypatch):
    layer = nn.Linear(16, 16).requires_grad_(False)  # two packed copies: 2 x 1,024 bytes
    monkeypatch.setattr(packed, "available_memory", lambda: 4 * 2048)
    with packed_linears(layer, frozen_only=True):
        assert hasattr(layer, packed.PACKED_T)
    monkeypatch.setattr(packed, "available_memory", lambda: 4 * 2048 - 4)
    with packed_linears(layer, frozen_only=True):
        assert not hasattr(layer, PACKED)
