"""Verified greedy decoding (`generate --set verify=true`): a low-precision draft, float32's tokens."""

import pytest
import torch

import llmkit.model.packed_linear as packed
from llmkit.core.config import resolve_config
from llmkit.errors import ConfigError
from llmkit.generation import GenerateConfig
from llmkit.model import cpu_kernels
from llmkit.model.decode_weights import decoding_weights
from llmkit.model.decoding import generate
from llmkit.model.packed_linear import PACKED, PACKED_GROUPS, packed_linears
from llmkit.model.verified_decoding import float32_twin, packed_for_decoding, verified_greedy
from tests.model.test_transformer import build, tokens

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def pack_every_matrix(monkeypatch):
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 1)  # the tiny model's matrices are all below the real bar


def lively(seed: int = 0):
    """A tiny model whose greedy tokens change from step to step (with its initialisation's small
    output projections a random model repeats its last token)."""
    model = build(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, p.shape[1] ** -0.5, generator=generator)
    return model


def greedy_of(model, prompt, n: int, eos_id=None) -> list[int]:
    return generate(model, prompt, n, greedy=True, eos_id=eos_id)[0].tolist()


@pytest.mark.parametrize("draft_tokens", [1, 3, 16])
def test_the_tokens_are_the_verifiers_whatever_the_draft(draft_tokens):
    """A draft of other weights parts from the verifier almost every token: each float32 pass then
    keeps its own token where the draft's differs, and the cache is cut back to the tokens kept."""
    verifier, draft = lively(0), lively(1)
    for seed in range(3):
        prompt = tokens(1, 7, seed=seed)
        expected = greedy_of(verifier, prompt, 24)
        assert greedy_of(draft, prompt, 24) != expected  # the draft alone would write other tokens
        assert verified_greedy(draft, verifier, prompt, 24, draft_tokens=draft_tokens)[0].tolist() == expected


def test_a_draft_the_verifier_agrees_with_is_kept_whole_and_one_more_token_comes_free(monkeypatch):
    model = lively()
    passes = []
    hidden_states = model.hidden_states
    monkeypatch.setattr(model, "hidden_states", lambda ids, *a, **k: passes.append(ids.shape[1]) or hidden_states(
        ids, *a, **k))
    prompt = tokens(1, 5)
    out = verified_greedy(model, model, prompt, 21, draft_tokens=4)[0].tolist()
    assert out == greedy_of(lively(), prompt, 21)
    # the prompt, then rounds of 4 drafted steps and one pass over 5 tokens that gives 5 (the last round: 1 + 4)
    assert passes == [5] + [1, 1, 1, 1, 5] * 4


def test_it_stops_after_the_end_of_sequence_token():
    verifier, draft = lively(0), lively(1)
    prompt = tokens(1, 7)
    free = greedy_of(verifier, prompt, 12)
    eos = free[7 + 5]  # the verifier's sixth new token
    expected = greedy_of(verifier, prompt, 12, eos_id=eos)
    out = verified_greedy(draft, verifier, prompt, 12, eos_id=eos)[0].tolist()
    assert out == expected[:expected.index(eos, 7) + 1] and out[-1] == eos


def test_the_twin_shares_the_weights_and_is_packed_apart(pack_every_matrix):
    model = build()
    with packed_linears(model):
        twin = float32_twin(model)  # made while the model is packed: none of it is carried over
        layer, twin_layer = model.model.layers[0].mlp.down_proj, twin.model.layers[0].mlp.down_proj
        assert twin_layer.weight is layer.weight and twin.model.embed_tokens.weight is model.model.embed_tokens.weight
        assert hasattr(layer, PACKED) and not hasattr(twin_layer, PACKED)
        assert not vars(twin.model.layers[0].self_attn).get(PACKED_GROUPS)
        with packed_linears(twin):
            assert getattr(twin_layer, PACKED) is not getattr(layer, PACKED)
    assert not hasattr(layer, PACKED) and "forward" not in vars(twin_layer)


@pytest.mark.skipif(not cpu_kernels.low_precision_available("int8"), reason="needs the int8 kernels")
def test_int8_weights_verified_give_float32s_tokens(pack_every_matrix):
    model = lively()
    prompts = [tokens(1, 6, seed=seed) for seed in range(4)]
    expected = [greedy_of(model, p, 32) for p in prompts]
    verifier = float32_twin(model)
    with decoding_weights(model, "int8"), packed_linears(model), packed_linears(verifier):
        assert [verified_greedy(model, verifier, p, 32)[0].tolist() for p in prompts] == expected


def test_verify_needs_greedy_decoding_and_a_cache_it_can_cut(monkeypatch):
    assert resolve_config(GenerateConfig, {"verify": True, "greedy": True}).verify
    resolve_config(GenerateConfig, {"verify": True, "temperature": 0})
    with pytest.raises(ConfigError, match="verify=true keeps float32's greedy tokens"):
        resolve_config(GenerateConfig, {"verify": True, "temperature": 0.7})
    hybrid = build(n_layers=2, layer_types=["linear_attention", "full_attention"])
    with pytest.raises(ConfigError, match="linear-attention"):
        with packed_for_decoding(hybrid, "int8", verify=True):
            pass
    with packed_for_decoding(build(), "fp32", verify=True) as verifier:
        assert verifier is None  # fp32 weights: no draft to check
    monkeypatch.setenv("LLMKIT_CPU_KERNELS", "fp32")  # no low-precision kernels: the fp32 fallback
    with packed_for_decoding(build(), "int8", verify=True) as verifier:
        assert verifier is None
