import pytest
import torch
import torch.nn as nn

import llmkit.model.packed_linear as packed
from llmkit.core.config import resolve_config
from llmkit.errors import ConfigError
from llmkit.generation import GenerateConfig
from llmkit.model import cpu_kernels
from llmkit.model.cpu_kernels import Bf16PanelWeight, F16PanelWeight, Int8PanelWeight
from llmkit.model.decode_weights import DecodeConfig, decoding_weights, forget_trained_copies
from llmkit.model.decoding import generate
from llmkit.model.packed_linear import PACKED, PACKED_GROUPS
from tests.model.test_transformer import build, tokens

KINDS = [pytest.param(k, marks=pytest.mark.skipif(not cpu_kernels.low_precision_available(k),
                                                  reason=f"needs the {k} kernels")) for k in ("bf16", "f16", "int8")]


@pytest.fixture
def pack_every_matrix(monkeypatch):
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 1)  # the tiny model's matrices are all below the real bar


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_through_low_precision_weights_are_mostly_fp32s(kind, pack_every_matrix):
    model, prompts = build(seed=1), tokens(12, 6, seed=3)
    model.lm_head.weight.data.mul_(8)  # sharper logits than a fresh model's: fewer near ties to flip
    fp32 = generate(model, prompts, max_new_tokens=8, greedy=True)
    with decoding_weights(model, kind):
        low = generate(model, prompts, max_new_tokens=8, greedy=True)
        head = model.lm_head
        kinds = dict(bf16=Bf16PanelWeight, f16=F16PanelWeight, int8=Int8PanelWeight)
        assert isinstance(getattr(head, PACKED), kinds[kind])
    assert sum(torch.equal(a, b) for a, b in zip(low, fp32)) >= 10
    assert not any(hasattr(m, PACKED) or "forward" in vars(m) for m in model.modules() if type(m) is nn.Linear)
    assert not any(getattr(m, PACKED_GROUPS, None) for m in model.modules())


@pytest.mark.parametrize("kind", KINDS)
def test_the_weights_are_converted_once_until_they_change(kind, pack_every_matrix):
    model = build()
    layer = model.model.layers[0].self_attn.o_proj
    with decoding_weights(model, kind):
        first = getattr(layer, PACKED)
    with decoding_weights(model, kind):
        assert getattr(layer, PACKED) is first
    with torch.no_grad():
        layer.weight.add_(1.0)  # a trainer's step
    with decoding_weights(model, kind):
        assert getattr(layer, PACKED) is not first


@pytest.mark.parametrize("kind", ["bf16", "f16", "int8"])
def test_the_forced_fallback_decodes_in_fp32(kind, pack_every_matrix, monkeypatch, capsys):
    model, prompts = build(), tokens(3, 5)
    monkeypatch.setenv("LLMKIT_CPU_KERNELS", "fp32")
    fp32 = generate(model, prompts, max_new_tokens=6, greedy=True)
    with torch.no_grad():
        logits = model(prompts)
    with decoding_weights(model, kind), torch.no_grad():
        assert torch.equal(generate(model, prompts, max_new_tokens=6, greedy=True), fp32)
        assert torch.equal(model(prompts), logits)
        assert not any(isinstance(getattr(m, PACKED, None), (Bf16PanelWeight, F16PanelWeight, Int8PanelWeight))
                       for m in model.modules())


def test_decode_weights_is_a_setting_of_generate():
    assert resolve_config(GenerateConfig, {"decode": {"weights": "int8"}}).decode.weights == "int8"
    with pytest.raises(ConfigError, match="decode.weights must be one of fp32, bf16, f16, int8"):
        DecodeConfig(weights="q4")


def test_decode_weights_is_a_setting_of_eval():
    from llmkit.eval.stage import EvalConfig

    assert resolve_config(EvalConfig, {"decode": {"weights": "bf16"}}).decode.weights == "bf16"


@pytest.mark.parametrize("kind", KINDS)
def test_forgetting_the_trained_copies_converts_the_layers_that_train_again(kind, pack_every_matrix):
    # torch's fused AdamW writes a step in place without moving the version counter `converted` reads
    model = build()
    trained, frozen = model.model.layers[0].self_attn.o_proj, model.model.layers[0].mlp.down_proj
    frozen.requires_grad_(False)
    with decoding_weights(model, kind):
        first = getattr(trained, PACKED), getattr(frozen, PACKED)
    forget_trained_copies(model)
    with decoding_weights(model, kind):
        assert getattr(trained, PACKED) is not first[0] and getattr(frozen, PACKED) is first[1]


@pytest.mark.parametrize("kind", KINDS)
def test_layers_packed_for_training_decode_through_a_copy_made_once(kind, pack_every_matrix):
    """A LoRA run's frozen base, packed for training's products and gradients, decodes a rollout's
    few rows through a `kind` copy, and keeps its training packing after the `with`."""
    model, prompts = build(), tokens(3, 5)
    model.requires_grad_(False)
    with packed.packed_linears(model, frozen_only=True):
        layer = model.model.layers[0].self_attn.o_proj
        training = getattr(layer, PACKED), getattr(layer, packed.PACKED_T)
        with decoding_weights(model, kind):
            generate(model, prompts, max_new_tokens=3, greedy=True)
            first = getattr(layer, packed.PACKED_FEW)
        with decoding_weights(model, kind):
            assert getattr(layer, packed.PACKED_FEW) is first
        assert isinstance(first, (Bf16PanelWeight, F16PanelWeight, Int8PanelWeight))
        assert not hasattr(layer, packed.PACKED_FEW)
        assert (getattr(layer, PACKED), getattr(layer, packed.PACKED_T)) == training
