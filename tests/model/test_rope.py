"""RoPE scaling against transformers 5: tiny random Llama and Qwen2 models built by transformers with
each scaling kind (linear, dynamic NTK, yarn with its defaults and with every option set, longrope,
llama3), read by llmkit.hf.mapping, give transformers' logits to 1e-4 in fp32 over a sequence 4x the
original context; step by step through a KV cache as well, where dynamic and longrope change their
frequencies as the sequence crosses the original context (the cached keys keep theirs, in both);
llmkit's greedy generation equals transformers'. Each scaling switched off makes the logits differ."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from llmkit.hf.mapping import from_hf_config, from_hf_state_dict
from llmkit.model.decoding import KVCache, generate
from llmkit.model.transformer import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")

ORIGINAL = 32  # the original context; the tests run to 4x it
SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
HALF = SHAPE["hidden_size"] // SHAPE["num_attention_heads"] // 2  # rotated pairs per head
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "yarn-options": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
                     "beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.25, "truncate": False},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
                    "mscale": 1.0, "mscale_all_dim": 0.5},
    "longrope": {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
                 "short_factor": [1.0 + 0.1 * i for i in range(HALF)],
                 "long_factor": [1.0 + 0.8 * i for i in range(HALF)]},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL},
}
FAMILIES = ("LlamaConfig", "Qwen2Config")


def hf_model(family: str, kind: str):
    """A fresh transformers model (transformers' dynamic RoPE remembers the longest sequence it saw),
    norms and biases moved off their initial values; its window is 4x the original context, but for
    dynamic, whose original context is max_position_embeddings itself. Matrices are drawn wider than
    transformers' init, so that positions matter to the logits."""
    window = ORIGINAL if kind == "dynamic" else 4 * ORIGINAL
    rope = {"rope_theta": 10000.0, **SCALINGS[kind]}
    config = getattr(transformers, family)(**SHAPE, max_position_embeddings=window, rope_parameters=rope,
                                           tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    return model


def ours(hf, **change) -> Transformer:
    cfg = dataclasses.replace(from_hf_config(hf.config.to_dict()), **change)
    model = Transformer(cfg)
    model.load_state_dict(from_hf_state_dict(hf.state_dict(), cfg), strict=True)
    return model.eval()


def tokens(n: int, batch: int = 1, seed: int = 1):
    return torch.randint(0, SHAPE["vocab_size"], (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", list(SCALINGS))
def test_logits_equal_transformers_at_4x_the_original_context(family, kind):
    hf = hf_model(family, kind)
    model = ours(hf)
    assert model.config.max_seq_len == 4 * ORIGINAL and model.config.rope_scaling["rope_type"] == kind.split("-")[0]
    ids = tokens(4 * ORIGINAL, batch=2)
    with torch.no_grad():
        theirs = hf(ids).logits
        assert (model(ids) - theirs).abs().max().item() < 1e-4, (family, kind)
        plain = ours(hf, rope_scaling=None)(ids)
    assert (plain - theirs)[:, ORIGINAL:].abs().max().item() > 1e-2  # the scaling is what makes them equal


def stepped_logits(forward, prompt, continuation) -> torch.Tensor:
    """The logits of the prompt's last token and of each continuation token, one forward per token
    after the prompt through a cache."""
    out = [forward(prompt, first=True)]
    for t in continuation.split(1, dim=1):
        out.append(forward(t, first=False))
    return torch.stack(out, 1)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["dynamic", "longrope", "yarn"])
def test_cached_decoding_across_the_original_context_equals_transformers(family, kind):
    """A 24-token prompt, then one token at a time to 4x the original context: dynamic's frequencies
    grow at every step beyond it, longrope switches to its long factors, the keys already cached keep
    the rotation they were made with."""
    hf, ids = hf_model(family, kind), tokens(4 * ORIGINAL)
    model = ours(hf)
    prompt, continuation = ids[:, :24], ids[:, 24:]
    hf_cache, cache = {}, KVCache(model.config, 1, 4 * ORIGINAL)

    def theirs(x, first):
        out = hf(x, past_key_values=None if first else hf_cache["kv"], use_cache=True)
        hf_cache["kv"] = out.past_key_values
        return out.logits[:, -1]

    def mine(x, first):
        return model(x, kv_cache=cache)[:, -1]

    with torch.no_grad():
        assert (stepped_logits(mine, prompt, continuation)
                - stepped_logits(theirs, prompt, continuation)).abs().max().item() < 1e-4, (family, kind)


@pytest.mark.parametrize("kind", ["dynamic", "longrope", "yarn", "linear"])
def test_greedy_generation_beyond_the_original_context_equals_transformers(kind):
    """Left-padded prompts of 20 and 28 tokens (the position of each row's tokens from its mask), 80
    new tokens each: the same tokens as transformers' generate."""
    hf = hf_model("LlamaConfig", kind)
    hf.generation_config.eos_token_id = None  # LlamaConfig's 2 would stop it early
    model = ours(hf)
    ids, mask = tokens(28, batch=2), torch.ones(2, 28, dtype=torch.long)
    ids[0, :8], mask[0, :8] = 0, 0
    with torch.no_grad():
        theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=80, do_sample=False, pad_token_id=0)
        mine = generate(model, ids, 80, greedy=True, attention_mask=mask)
    assert torch.equal(mine, theirs), kind
