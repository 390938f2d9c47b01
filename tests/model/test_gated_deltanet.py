"""The Gated DeltaNet mixer equals transformers' Qwen3.5 linear-attention layer and its two forms of
the gated delta rule (fp32, ≤ 1e-4) for sequences shorter than a chunk, a chunk long, and longer
but not a multiple of it; a prefill followed by single-token steps (the decoding path) equals one
pass over the whole sequence."""

from __future__ import annotations

import types

import pytest
import torch
import transformers
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from llmkit.model.gated_deltanet import (CHUNK_SIZE, GatedDeltaNet, chunked_gated_delta_rule,
                                   recurrent_gated_delta_rule)
from llmkit.model.config import ModelConfig

LENGTHS = (7, CHUNK_SIZE, 2 * CHUNK_SIZE + 23)  # shorter than a chunk, one chunk, not a multiple
SHAPE = dict(hidden_size=48, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
             linear_value_head_dim=8, linear_conv_kernel_dim=4, rms_norm_eps=1e-6)


def rule_inputs(T, seed=0, batch=2, k_heads=2, v_heads=4, dk=16, dv=8):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, T, k_heads, dk, generator=g) for _ in range(2))
    v = torch.randn(batch, T, v_heads, dv, generator=g)
    decay = -torch.rand(batch, T, v_heads, generator=g) * 0.5  # log decays <= 0
    beta = torch.rand(batch, T, v_heads, generator=g)
    state = torch.randn(batch, v_heads, dk, dv, generator=g)
    return q, k, v, decay, beta, state


def assert_close(ours, theirs, tol=1e-4):
    assert (ours - theirs).abs().max().item() <= tol


@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("from_state", [False, True])
def test_both_forms_equal_transformers_functions(T, from_state):
    q, k, v, g, beta, state = rule_inputs(T)
    state = state if from_state else None
    kwargs = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    theirs, their_state = hf.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, **kwargs)
    for rule in (chunked_gated_delta_rule, recurrent_gated_delta_rule):
        ours, our_state = rule(q, k, v, g, beta, state)
        assert ours.shape == theirs.shape == v.shape
        assert_close(ours, theirs)
        assert_close(our_state, their_state)
    theirs_stepwise, _ = hf.torch_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **kwargs)
    assert_close(recurrent_gated_delta_rule(q, k, v, g, beta, state)[0], theirs_stepwise)


def layer_pair(seed=0):
    """(ours, transformers' layer) with the same random weights, loaded by their shared names."""
    config = transformers.Qwen3_5TextConfig(**SHAPE, num_hidden_layers=1, layer_types=["linear_attention"])
    torch.manual_seed(seed)
    theirs = hf.Qwen3_5GatedDeltaNet(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 1.0) + (1.0 if p.dim() == 1 else 0.0))
    cfg = ModelConfig(hidden_size=48, n_layers=1, n_heads=4, layer_types=["linear_attention"], linear_n_key_heads=2,
                      linear_n_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel=4,
                      norm_eps=1e-6)
    ours = GatedDeltaNet(cfg, layer_idx=0).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours, theirs


@pytest.mark.parametrize("T", LENGTHS)
def test_the_layer_equals_transformers_layer(T):
    ours, theirs = layer_pair()
    x = torch.randn(2, T, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_close(ours(x), theirs(x))


def test_padding_is_zeroed_as_transformers_does():
    ours, theirs = layer_pair()
    x = torch.randn(3, 30, 48, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, 30, dtype=torch.long)
    mask[0, :9] = 0  # left padding
    mask[1, 21:] = 0  # right padding
    with torch.no_grad():
        padded = ours(x, token_mask=mask)
        assert_close(padded, theirs(x, attention_mask=mask))
        # left padding leaves the state zero: the real tokens' outputs are those of the unpadded row
        assert_close(padded[0, 9:], ours(x[:1, 9:])[0])
        assert_close(padded[1, :21], ours(x[1:2, :21])[0])


def test_a_prefill_then_single_token_steps_equal_the_full_pass():
    ours, _ = layer_pair()
    x = torch.randn(2, CHUNK_SIZE + 20, 48, generator=torch.Generator().manual_seed(3))
    cache = types.SimpleNamespace(recurrent=[None])
    with torch.no_grad():
        full = ours(x)
        pieces = [ours(x[:, :CHUNK_SIZE + 5], cache=cache),  # chunked from zeros
                  ours(x[:, CHUNK_SIZE + 5:CHUNK_SIZE + 11], cache=cache)]  # chunked from the state
        pieces += [ours(x[:, t:t + 1], cache=cache) for t in range(CHUNK_SIZE + 11, x.shape[1])]  # recurrent
    assert_close(torch.cat(pieces, dim=1), full)
    assert cache.recurrent[0].conv.shape == (2, 2 * 32 + 32, 3)


def test_packed_documents_give_what_each_gives_alone():
    """A row packing three documents (one crossing a chunk boundary) gives each document's own
    outputs: the state starts from zero and the convolution reads nothing of the document before."""
    ours, _ = layer_pair()
    lengths = (CHUNK_SIZE - 10, 30, 41)
    docs = [torch.randn(1, n, 48, generator=torch.Generator().manual_seed(n)) for n in lengths]
    doc_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    with torch.no_grad():
        packed = ours(torch.cat(docs, dim=1), doc_ids=doc_ids)
        alone = torch.cat([ours(d) for d in docs], dim=1)
    assert_close(packed, alone)


def test_both_forms_cut_the_state_at_document_starts():
    q, k, v, g, beta, state = rule_inputs(LENGTHS[-1])
    starts = torch.zeros(2, LENGTHS[-1], dtype=torch.bool)
    starts[0, [5, CHUNK_SIZE, CHUNK_SIZE + 1, 100]] = True
    chunked, chunked_state = chunked_gated_delta_rule(q, k, v, g, beta, state, starts)
    recurrent, recurrent_state = recurrent_gated_delta_rule(q, k, v, g, beta, state, starts)
    assert_close(chunked, recurrent)
    assert_close(chunked_state, recurrent_state)
    after = recurrent_gated_delta_rule(q[:1, 100:], k[:1, 100:], v[:1, 100:], g[:1, 100:], beta[:1, 100:])[0]
    assert_close(chunked[:1, 100:], after)  # the last document as if it were alone


def test_both_forms_keep_float32_under_a_bf16_autocast():
    q, k, v, g, beta, state = rule_inputs(LENGTHS[-1])
    exact = recurrent_gated_delta_rule(q, k, v, g, beta, state)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for rule in (chunked_gated_delta_rule, recurrent_gated_delta_rule):
            assert_close(rule(q, k, v, g, beta, state)[0], exact, tol=1e-5)
