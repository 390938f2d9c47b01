import pytest
import torch
import torch.nn as nn

import llmkit.model.packed_linear as packed
from llmkit.model import cpu_kernels
from llmkit.model.decoding import generate
from llmkit.model.transformer import MLP, Attention
from llmkit.model.packed_linear import PACKED, PACKED_GROUPS, grouped_products, packed_linears
from tests.model.test_transformer import build, tokens


@pytest.fixture
def pack_every_matrix(monkeypatch):
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 1)  # the tiny model's matrices are all below the real bar


def linears(model):
    return [m for m in model.modules() if type(m) is nn.Linear]


def grouped_layers(model):
    return {getattr(m, n) for m in model.modules() for names in getattr(m, "PRODUCT_GROUPS", {}).values()
            for n in names}


def test_packed_layers_compute_what_linear_computes_and_are_restored_after(pack_every_matrix):
    model = build(tie_embeddings=False, attention_bias=True)
    x = tokens(3, 7)
    grouped = grouped_layers(model)  # q/k/v and gate/up: packed together, each group one matrix
    with torch.no_grad():
        plain = model(x)
        with packed_linears(model):
            assert all(hasattr(m, PACKED) and "forward" in vars(m) for m in linears(model) if m not in grouped)
            assert not any(hasattr(m, PACKED) for m in grouped)
            assert all(set(getattr(m, PACKED_GROUPS)) == set(m.PRODUCT_GROUPS) for m in model.modules()
                       if isinstance(m, (Attention, MLP)))
            assert torch.allclose(model(x), plain, atol=1e-5, rtol=1e-5)
    assert not any(hasattr(m, PACKED) or "forward" in vars(m) for m in linears(model))
    assert not any(getattr(m, PACKED_GROUPS, None) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(x), plain)


def test_a_group_is_one_product_of_the_concatenated_weights_and_gradients_take_the_layers(
        pack_every_matrix, monkeypatch):
    attention = build(attention_bias=True).model.layers[0].self_attn
    x = torch.randn(2, 3, attention.q_proj.in_features)
    expected = [attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)]
    calls = []
    monkeypatch.setattr(nn.Linear, "forward", lambda self, x: calls.append(self) or nn.functional.linear(
        x, self.weight, self.bias))
    with packed_linears(attention), torch.no_grad():
        q, k, v = grouped_products(attention, "qkv", x)
    assert calls == []  # no layer's own call: the group's one product
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip((q, k, v), expected))
    with packed_linears(attention):
        q, k, v = grouped_products(attention, "qkv", x.requires_grad_())
    assert calls == [attention.q_proj, attention.k_proj, attention.v_proj]  # a gradient needs the layers
    assert q.requires_grad


def test_greedy_generation_is_the_same_packed_or_not(pack_every_matrix, monkeypatch):
    model, prompts = build(), tokens(4, 5)
    with_packing = generate(model, prompts, max_new_tokens=12, greedy=True)
    monkeypatch.setenv("LLMKIT_PACKED_LINEAR", "0")
    assert torch.equal(generate(model, prompts, max_new_tokens=12, greedy=True), with_packing)


def test_nested_uses_pack_once_and_the_outer_one_restores(pack_every_matrix):
    model = build()
    layer = model.model.layers[0].self_attn.o_proj
    attention = model.model.layers[0].self_attn
    with packed_linears(model):
        first, first_group = getattr(layer, PACKED), getattr(attention, PACKED_GROUPS)["qkv"]
        with packed_linears(model):
            assert getattr(layer, PACKED) is first and getattr(attention, PACKED_GROUPS)["qkv"] is first_group
            assert not hasattr(attention.q_proj, PACKED)
        # the inner exit left the outer's packing in place
        assert getattr(layer, PACKED) is first and getattr(attention, PACKED_GROUPS)["qkv"] is first_group
    assert not hasattr(layer, PACKED) and not getattr(attention, PACKED_GROUPS)


def test_layers_packed_one_by_one_for_training_are_not_packed_again_as_a_group(pack_every_matrix):
    # a frozen base packed for the run (frozen_only), then a rollout's generation inside it
    model = build().requires_grad_(False)
    attention = model.model.layers[0].self_attn
    with packed_linears(model, frozen_only=True):
        assert hasattr(attention.q_proj, PACKED)
        with packed_linears(model):
            assert not getattr(attention, PACKED_GROUPS, None)  # the layers' own packed copies serve


@pytest.mark.skipif(not cpu_kernels.available(), reason="needs AVX-512 and a C++ compiler")
def test_a_rollout_inside_training_decodes_through_panels_and_training_keeps_onednn(
        pack_every_matrix, monkeypatch):
    model, prompts = build().requires_grad_(False), tokens(2, 5)
    layer = model.model.layers[0].self_attn.o_proj
    calls, product = [], cpu_kernels.PanelWeight.product
    monkeypatch.setattr(cpu_kernels.PanelWeight, "product", lambda self, *a: calls.append(self) or product(self, *a))
    with packed_linears(model, frozen_only=True):
        assert isinstance(getattr(layer, PACKED), packed.OneDNNWeight)  # faster at training's many rows
        with packed_linears(model), torch.no_grad():
            assert isinstance(getattr(layer, packed.PACKED_FEW), cpu_kernels.PanelWeight)
            model(prompts)
            assert getattr(layer, packed.PACKED_FEW) in calls
        assert not hasattr(layer, packed.PACKED_FEW) and hasattr(layer, packed.PACKED_T)


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


def test_a_bf16_frozen_base_multiplies_bf16_operands_both_ways_and_adds_its_bias_in_fp32(pack_every_matrix):
    # lora.base_products=bf16: the frozen layer's product and its input's gradient round both
    # operands to bf16, sum in fp32 and round the sums to bf16 (as autocast's products do); the
    # bias is added in fp32; the layer that trains computes in fp32 as ever
    torch.manual_seed(0)
    frozen, trained = nn.Linear(48, 40).requires_grad_(False), nn.Linear(32, 48)
    model = nn.Sequential(trained, frozen)
    x = torch.randn(5, 32)
    bf16 = lambda t: t.to(torch.bfloat16).double()  # noqa: E731
    with packed_linears(model, frozen_only=True, frozen_dtype=torch.bfloat16):
        assert not hasattr(trained, PACKED)
        hidden = trained(x).detach().requires_grad_()
        out = frozen(hidden)
        grad = torch.randn_like(out)
        out.backward(grad)
    w, b = frozen.weight.double(), frozen.bias.double()
    one_ulp = dict(rtol=2 ** -8, atol=1e-6)  # the bf16 rounding of an fp32 sum
    torch.testing.assert_close(out.double(), bf16(bf16(hidden.detach()) @ bf16(w).t()) + b, **one_ulp)
    torch.testing.assert_close(hidden.grad.double(), bf16(bf16(grad) @ bf16(w)), **one_ulp)
    exact = hidden.detach().double() @ w.t() + b
    assert 1e-4 < (out.double() - exact).abs().max() < 3e-2  # bf16's rounding, not fp32's
    assert out.dtype == hidden.grad.dtype == torch.float32


def test_bf16_copies_of_a_frozen_base_need_half_the_memory(pack_every_matrix, monkeypatch):
    layer = nn.Linear(16, 16).requires_grad_(False)  # two bf16 copies: 2 x 512 bytes
    monkeypatch.setattr(packed, "available_memory", lambda: 4 * 1024)
    with packed_linears(layer, frozen_only=True, frozen_dtype=torch.bfloat16):
        assert hasattr(layer, packed.PACKED_T)
    with packed_linears(layer, frozen_only=True):
        assert not hasattr(layer, PACKED)  # fp32's two copies (2 x 1,024 bytes) do not fit
