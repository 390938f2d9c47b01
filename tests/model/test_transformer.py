import json

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file

import llmkit.model.transformer
from llmkit.model.decoding import KVCache, generate, generate_replies, left_pad, sample_next_token
from llmkit.hf.mapping import from_hf_config, from_hf_state_dict, to_hf_config, to_hf_state_dict
from llmkit.model.transformer import ConfigError, Transformer
from llmkit.model.config import ModelConfig, model_config
from tests.train.posttrain_fixtures import constant_model

VOCAB = 97


def tiny(**overrides) -> ModelConfig:
    shape = dict(vocab_size=VOCAB, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=96,
                 max_seq_len=64)
    return ModelConfig(**{**shape, **overrides})


def build(seed=0, **overrides) -> Transformer:
    model = Transformer(tiny(**overrides))
    model.init_weights(seed=seed)
    return model.eval()


def tokens(*shape, seed=0):
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


# ---- config and presets ----

def test_presets_have_the_documented_parameter_counts():
    with torch.device("meta"):
        counts = {name: Transformer(model_config(name)).num_parameters()
                  for name in ("tiny", "small", "smol-135m", "1b")}
    assert 0.8e6 < counts["tiny"] < 1.2e6
    assert 10e6 < counts["small"] < 20e6
    assert counts["smol-135m"] == 134_515_008  # SmolLM-135M
    assert counts["1b"] == 1_235_814_400  # Llama-3.2-1B


def test_preset_overrides_and_bad_keys():
    assert model_config("smol-135m", vocab_size=1000).vocab_size == 1000
    with pytest.raises(ConfigError, match="n_layers"):
        model_config("tiny", n_layer=3)
    with pytest.raises(ConfigError, match="unknown model preset"):
        model_config("huge")


@pytest.mark.parametrize("bad", [dict(n_heads=3), dict(n_kv_heads=3), dict(norm="batchnorm"), dict(n_experts=1),
                                 dict(n_experts=4, experts_top_k=5), dict(sliding_window=0)])
def test_invalid_config_is_rejected(bad):
    with pytest.raises(ConfigError):
        tiny(**bad)


def test_seeded_init_is_reproducible_and_scales_residual_projections():
    a, b, c = build(seed=1), build(seed=1), build(seed=2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    layer = a.model.layers[0]
    assert layer.self_attn.o_proj.weight.std() < 0.6 * layer.self_attn.q_proj.weight.std()  # 1/sqrt(2 * 2 layers)


def test_flops_count_only_routed_experts():
    T = 32
    dense = Transformer(tiny())
    per_token = 6 * dense.num_parameters() + 12 * 2 * 4 * 16 * T
    assert dense.flops_per_token(T) == per_token
    untied = Transformer(tiny(tie_embeddings=False))
    untied_head = untied.num_parameters() - dense.num_parameters()
    assert untied_head == VOCAB * 64 and untied.flops_per_token(T) == per_token  # the head replaces the lookup
    # 4 experts, top-2 runs like a dense MLP twice as wide, plus the router
    moe = Transformer(tiny(n_experts=4, experts_top_k=2))
    wide = Transformer(tiny(intermediate_size=2 * 96))
    assert moe.flops_per_token(T) == wide.flops_per_token(T) + 6 * 2 * 64 * 4
    assert Transformer(tiny(sliding_window=8)).flops_per_token(T) == dense.flops_per_token(8)


# ---- attention behaviour ----

@pytest.mark.parametrize("overrides", [{}, dict(n_experts=4), dict(norm="layernorm"), dict(sliding_window=4)])
def test_future_tokens_never_change_past_logits(overrides):
    model = build(**overrides)
    x = tokens(2, 12)
    y = x.clone()
    y[:, 7:] = tokens(2, 5, seed=1)
    torch.testing.assert_close(model(x)[:, :7], model(y)[:, :7], atol=1e-6, rtol=0)  # MoE regroups tokens
    assert not torch.allclose(model(x)[:, 7:], model(y)[:, 7:])


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_grouped_query_attention_shapes_and_gradients(n_kv_heads):
    model = build(n_kv_heads=n_kv_heads).train()
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (n_kv_heads * 16, 64)
    logits = model(tokens(2, 10))
    assert logits.shape == (2, 10, VOCAB) and logits.dtype == torch.float32
    logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_sliding_window_hides_tokens_beyond_the_window():
    window, layers = 3, 2
    model = build(sliding_window=window, n_layers=layers)
    x = tokens(1, 16)
    y = x.clone()
    y[0, 0] = (x[0, 0] + 1) % VOCAB
    changed = (model(x) - model(y)).abs().amax(-1)[0] > 0
    reach = layers * (window - 1)  # each layer looks window-1 tokens further back
    assert changed[: window].all()
    assert not changed[reach + 1:].any()


def test_packed_documents_do_not_attend_to_each_other():
    model = build()
    doc1, doc2, other_doc2 = tokens(1, 5), tokens(1, 7, seed=1), tokens(1, 7, seed=2)
    doc_ids = torch.tensor([[0] * 5 + [1] * 7])
    position_ids = torch.cat([torch.arange(5), torch.arange(7)])[None]
    packed = model(torch.cat([doc1, doc2], 1), position_ids, doc_ids)
    packed_other = model(torch.cat([doc1, other_doc2], 1), position_ids, doc_ids)
    torch.testing.assert_close(packed[:, :5], packed_other[:, :5], atol=1e-6, rtol=0)
    torch.testing.assert_close(packed[:, 5:], model(doc2), atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[:, :5], model(doc1), atol=1e-5, rtol=0)


def test_left_padding_gives_the_unpadded_logits():
    model = build()
    x = tokens(1, 6)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1)
    mask = torch.tensor([[0, 0, 0] + [1] * 6])
    torch.testing.assert_close(model(padded, attention_mask=mask)[:, 3:], model(x), atol=1e-5, rtol=0)


def test_gradient_checkpointing_gives_the_same_gradients():
    grads = []
    for checkpointing in (False, True):
        model = build(n_experts=4).train()
        model.gradient_checkpointing = checkpointing
        (model(tokens(2, 8)).logsumexp(-1).mean() + model.aux_loss).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


# ---- attention kernels: flex block mask vs dense mask ----

def flex_with_cpu_backward(q, k, v, block_mask, enable_gqa):
    """What flex_attention runs uncompiled (its reference computation), called below the public
    function, which refuses to build a backward on CPU."""
    # private API of the pinned torch (2.13): a torch without it fails here, visibly, not skips
    from torch._higher_order_ops.flex_attention import flex_attention as flex_op
    from torch.nn.attention.flex_attention import _apply_kernel_options

    options = _apply_kernel_options(q, k, v, False, None, None)
    out, _, _ = flex_op(q, k, v, lambda score, b, h, q_idx, k_idx: score, block_mask.as_tuple(),
                        q.shape[-1] ** -0.5, options)
    return out


def run_kernel(model, kernel, inputs):
    """Logits and every parameter's gradient with the given attention kernel."""
    model.attention_kernel = kernel
    model.zero_grad()
    logits = model(**inputs)
    logits.logsumexp(-1).mean().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


# on CPU the model calls flex_attention uncompiled, which warns that it is unfused (meant for GPUs)
eager_flex = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

ATTENTION_CASES = {
    "packed documents": ({}, lambda: dict(input_ids=tokens(2, 12), doc_ids=torch.tensor(
        [[0] * 5 + [1] * 7, [0] * 9 + [1] * 3]))),
    "left padding": ({}, lambda: dict(input_ids=tokens(2, 12), attention_mask=torch.tensor(
        [[1] * 12, [0] * 4 + [1] * 8]))),
    "sliding window": (dict(sliding_window=4), lambda: dict(input_ids=tokens(2, 12))),
    "window, documents and padding across several 128-token blocks": (
        dict(sliding_window=150, max_seq_len=400), lambda: dict(
            input_ids=tokens(2, 300), doc_ids=torch.tensor([[0] * 100 + [1] * 200, [0] * 280 + [1] * 20]),
            attention_mask=torch.tensor([[1] * 300, [0] * 130 + [1] * 170]))),
    "mixture of experts, packed": (dict(n_experts=4), lambda: dict(input_ids=tokens(2, 12), doc_ids=torch.tensor(
        [[0] * 5 + [1] * 7, [0] * 9 + [1] * 3]))),
}


@eager_flex
@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_flex_block_mask_gives_the_dense_masks_logits_and_gradients(case, monkeypatch):
    overrides, make_inputs = ATTENTION_CASES[case]
    model, inputs = build(**overrides).train(), make_inputs()
    model.attention_kernel = "flex"
    assert not isinstance(model.attention_mask(2, inputs["input_ids"].shape[1], 0, torch.device("cpu"),
                                               inputs.get("doc_ids"), inputs.get("attention_mask")), torch.Tensor)
    with torch.no_grad():  # the public flex_attention, as the model calls it on CPU
        flex_logits = model(**inputs)
    monkeypatch.setattr(llmkit.model.transformer, "flex_attention", flex_with_cpu_backward)
    flex = run_kernel(model, "flex", inputs)
    dense = run_kernel(model, "dense", inputs)
    torch.testing.assert_close(flex_logits, dense[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flex[0], dense[0], atol=1e-5, rtol=1e-5)
    for a, b in zip(flex[1], dense[1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@eager_flex
@pytest.mark.parametrize("overrides", [{}, dict(sliding_window=4)])
def test_generation_with_a_flex_prefill_equals_the_dense_one(overrides):
    model = build(**overrides)
    batch = tokens(2, 7)
    mask = torch.tensor([[1] * 7, [0] * 4 + [1] * 3])
    out = {}
    for kernel in ("flex", "dense"):
        model.attention_kernel = kernel
        out[kernel] = generate(model, batch, max_new_tokens=6, greedy=True, attention_mask=mask)
    assert torch.equal(out["flex"], out["dense"])


@eager_flex
def test_the_attention_kernel_is_dense_on_cpu_unless_chosen(monkeypatch):
    model = build()
    cpu, doc_ids = torch.device("cpu"), torch.tensor([[0] * 3 + [1] * 5])
    assert model.attention_kernel == "auto"
    assert model.attention_mask(1, 8, 0, cpu, None, None) is None  # plain causal: SDPA's own
    assert model.attention_mask(1, 8, 0, cpu, doc_ids, None).shape == (1, 1, 8, 8)
    monkeypatch.setenv("LLMKIT_ATTENTION", "flex")
    model = build()
    assert not isinstance(model.attention_mask(1, 8, 0, cpu, doc_ids, None), torch.Tensor)
    assert model.attention_mask(1, 1, 8, cpu, None, torch.ones(1, 9)).shape == (1, 1, 1, 9)  # decoding: dense
    monkeypatch.setenv("LLMKIT_ATTENTION", "fast")
    with pytest.raises(ConfigError, match="LLMKIT_ATTENTION"):
        build()


# ---- the loss inside forward ----

@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_targets_give_the_cross_entropy_of_the_full_logits_and_its_gradients(label_smoothing):
    model = build(tie_embeddings=False).train()
    model.loss_chunk_size = 5  # 20 labelled positions: four chunks
    x, targets = tokens(2, 12), tokens(2, 12, seed=1)
    targets[0, :4] = -100
    full = F.cross_entropy(model(x).flatten(0, 1), targets.flatten(), label_smoothing=label_smoothing)
    full.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    chunked = model(x, targets=targets, label_smoothing=label_smoothing)
    chunked.backward()
    torch.testing.assert_close(chunked, full)
    for a, b in zip(expected, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, b)


def test_the_loss_path_saves_no_logits_for_backward():
    model = build().train()
    model.loss_chunk_size = 4
    x, targets = tokens(2, 12), tokens(2, 12, seed=1)

    def widths_saved(loss_of):
        widths = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: widths.append(t.shape[-1:]) or t, lambda t: t):
            loss_of().backward()
        return widths

    assert (VOCAB,) in widths_saved(lambda: F.cross_entropy(model(x).flatten(0, 1), targets.flatten()))
    assert (VOCAB,) not in widths_saved(lambda: model(x, targets=targets))


# ---- mixture of experts ----

def test_moe_trains_the_router_through_the_balancing_loss():
    model = build(n_experts=4, experts_top_k=2, router_aux_loss_coef=0.1).train()
    logits = model(tokens(2, 10))
    assert model.aux_loss > 0
    model.aux_loss.backward(retain_graph=True)
    assert model.model.layers[0].block_sparse_moe.gate.weight.grad.abs().sum() > 0
    logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert build().aux_loss == 0


def test_balancing_loss_matches_transformers_divided_by_top_k():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    model = build(n_experts=4, experts_top_k=2, n_layers=1, router_aux_loss_coef=1.0)
    router_logits = []
    model.model.layers[0].block_sparse_moe.gate.register_forward_hook(lambda m, i, out: router_logits.append(out))
    model(tokens(2, 10))
    reference = load_balancing_loss_func((router_logits[0],), 4, top_k=2)
    torch.testing.assert_close(model.aux_loss, reference / 2)


# ---- generation ----

def greedy_without_cache(model, prompt, n):
    for _ in range(n):
        prompt = torch.cat([prompt, model(prompt)[:, -1].argmax(-1, keepdim=True)], 1)
    return prompt


@pytest.mark.parametrize("overrides", [{}, dict(sliding_window=4), dict(n_experts=4)])
def test_cached_generation_of_a_left_padded_batch_equals_full_recomputation(overrides):
    model = build(**overrides)
    long, short = tokens(1, 7), tokens(1, 3, seed=1)
    batch = torch.cat([long, torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1)])
    mask = torch.tensor([[1] * 7, [0] * 4 + [1] * 3])
    out = generate(model, batch, max_new_tokens=6, greedy=True, attention_mask=mask)
    assert torch.equal(out[0], greedy_without_cache(model, long, 6)[0])
    assert torch.equal(out[1, 4:], greedy_without_cache(model, short, 6)[0])


def test_a_row_that_emits_eos_keeps_emitting_it():
    model = build()
    prompts = tokens(3, 5)
    free = generate(model, prompts, max_new_tokens=6, greedy=True)
    eos = int(free[0, 5])
    out = generate(model, prompts, max_new_tokens=6, greedy=True, eos_id=eos)
    assert (out[0, 5:] == eos).all()
    for row in (1, 2):
        first_eos = (free[row, 5:] == eos).nonzero()
        stop = 5 + (int(first_eos[0]) if len(first_eos) else 6)
        assert torch.equal(out[row, :stop], free[row, :stop])


def rows_per_forward(model, monkeypatch) -> list[tuple[int, int]]:
    """(rows, new positions) of every forward `generate` makes from now on."""
    calls, forward = [], model.hidden_states
    monkeypatch.setattr(model, "hidden_states",
                        lambda ids, *a, **k: calls.append(tuple(ids.shape)) or forward(ids, *a, **k))
    return calls


def test_a_shared_prefix_and_repeated_prompts_are_prefilled_once_with_the_same_tokens(monkeypatch):
    model = build()
    prefix = tokens(1, 5)[0].tolist()
    own = [[11, 12], [13], [11, 12], [14, 15, 16]]  # rows 0 and 2 repeat one prompt
    prompts = [prefix + r for r in own]
    ids, mask = left_pad(prompts, pad_id=0)
    calls = rows_per_forward(model, monkeypatch)
    out = generate(model, ids, max_new_tokens=4, greedy=True, attention_mask=mask)
    # the prefix once (1 row), then the three distinct rests (3 rows, up to 3 tokens), then one token a step
    assert calls[:2] == [(1, 5), (3, 3)] and calls[2:] == [(4, 1)] * 3
    for row, prompt in enumerate(prompts):
        expected = greedy_without_cache(model, torch.tensor([prompt]), 4)[0, len(prompt):]
        assert torch.equal(out[row, ids.shape[1]:], expected)


def test_rows_that_stopped_leave_the_batch_and_sampling_draws_the_same_tokens(monkeypatch):
    model = build()
    prompts = tokens(4, 3, seed=2)
    free = generate(model, prompts, max_new_tokens=6, temperature=1.0, generator=torch.Generator().manual_seed(5))
    eos = int(free[1, 4])  # row 1 stops after two tokens
    calls = rows_per_forward(model, monkeypatch)
    out = generate(model, prompts, max_new_tokens=6, temperature=1.0, eos_id=eos,
                   generator=torch.Generator().manual_seed(5))
    assert min(rows for rows, _ in calls[1:]) < 4  # a finished row is not computed any more
    for row in range(4):  # the seed draws each row's tokens as if every row had computed to the end
        stop = (free[row, 3:] == eos).nonzero()
        end = 3 + (int(stop[0]) + 1 if len(stop) else 6)
        assert torch.equal(out[row, :end], free[row, :end]) and (out[row, end:] == eos).all()


def test_sampling_filters_and_generator_make_it_deterministic():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9]])
    assert sample_next_token(logits, top_k=1) == 1
    assert sample_next_token(logits, top_p=0.01) == 1
    draws = {int(sample_next_token(logits, top_k=2)) for _ in range(50)}
    assert draws == {1, 3}
    model = build()
    a = generate(model, tokens(2, 4), 5, temperature=1.5, generator=torch.Generator().manual_seed(3))
    b = generate(model, tokens(2, 4), 5, temperature=1.5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_sampling_draws_each_token_with_its_probability_and_never_an_impossible_one():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    n = 40_000
    draws = sample_next_token(probs.log().expand(n, -1), generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=5).double()
    sigma = (n * probs * (1 - probs)).double().sqrt()
    assert ((counts - n * probs).abs() <= 4 * sigma + 1e-9).all(), counts.tolist()
    assert counts[4] == 0
    # one number per row of the full batch: rows 1 and 3 of 4 draw what they draw in the full batch
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    full = sample_next_token(logits, generator=torch.Generator().manual_seed(1))
    some = sample_next_token(logits[[1, 3]], generator=torch.Generator().manual_seed(1), rows=torch.tensor([1, 3]),
                             batch_size=4)
    assert torch.equal(some, full[[1, 3]])


def test_sequences_beyond_max_seq_len_or_the_cache_are_rejected():
    model = build()
    with pytest.raises(ValueError, match="max_seq_len"):
        model(tokens(1, 65))
    cache = KVCache(model.config, 1, 10)
    model.hidden_states(tokens(1, 8), kv_cache=cache)
    assert cache.length == 8
    with pytest.raises(ValueError, match="KV cache"):
        model.hidden_states(tokens(1, 3), kv_cache=cache)


# ---- Hugging Face parity ----

def hf_model(cfg: ModelConfig, tmp_path, model: Transformer):
    """Write what export writes and load it with transformers' own from_pretrained."""
    save_file(to_hf_state_dict(model), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(to_hf_config(cfg)))
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True,
                                                                 dtype=torch.float32)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return hf.eval()


@pytest.mark.parametrize("overrides", [dict(tie_embeddings=True), dict(tie_embeddings=False),
                                       dict(sliding_window=5), dict(n_experts=4, experts_top_k=2),
                                       dict(n_experts=4, experts_top_k=1, tie_embeddings=False, sliding_window=6)])
def test_logits_match_transformers(overrides, tmp_path):
    cfg = tiny(rope_theta=5000.0, **overrides)
    model = build(**overrides, rope_theta=5000.0)
    hf = hf_model(cfg, tmp_path, model)
    assert type(hf).__name__ == to_hf_config(cfg)["architectures"][0]
    x = tokens(2, 20)
    with torch.no_grad():
        diff = (model(x) - hf(x).logits).abs().max()
    assert diff < 1e-4
    # and back: transformers' in-memory state_dict (fused experts in v5) imports strictly
    again = Transformer(from_hf_config(hf.config.to_dict()))
    again.load_state_dict(from_hf_state_dict(hf.state_dict(), again.config), strict=True)
    assert torch.equal(again(x), model(x))


def test_left_padded_logits_match_transformers(tmp_path):
    cfg = tiny()
    model = build()
    hf = hf_model(cfg, tmp_path, model)
    x = tokens(2, 9)
    mask = torch.tensor([[1] * 9, [0] * 3 + [1] * 6])
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours = model(x, attention_mask=mask)
        theirs = hf(x, attention_mask=mask, position_ids=position_ids).logits
    real = mask.bool()
    assert (ours[real] - theirs[real]).abs().max() < 1e-4


def test_state_dict_names_are_llama_names():
    model = build(tie_embeddings=False)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**to_hf_config(model.config)))
    assert set(model.state_dict()) == set(hf.state_dict())
    hf.load_state_dict(model.state_dict(), strict=True)


@pytest.mark.parametrize("overrides", [{}, dict(sliding_window=8), dict(n_experts=8, experts_top_k=2)])
def test_hf_config_round_trip(overrides):
    cfg = tiny(**overrides)
    assert from_hf_config(to_hf_config(cfg)) == cfg


def test_layernorm_models_cannot_be_exported():
    with pytest.raises(ConfigError, match="rmsnorm"):
        to_hf_config(tiny(norm="layernorm"))


@pytest.mark.parametrize("overrides", [{}, dict(n_experts=4)])
def test_bf16_weights_and_autocast_run_forward_and_cached_generation(overrides):
    model = build(**overrides)
    x = tokens(2, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
        out = generate(model, x, 3, greedy=True, attention_mask=torch.tensor([[1] * 6, [0] + [1] * 5]))
    assert logits.dtype == torch.float32 and out.shape == (2, 9)
    full = model(x)
    model.to(torch.bfloat16)
    assert model(x).dtype == torch.float32
    assert (model(x) - full).abs().max() < 0.1  # bf16 keeps the logits close
    assert generate(model, x, 3, greedy=True).shape == (2, 9)


def test_replies_stop_before_the_first_stop_token_and_fit_the_context():
    model = constant_model(40)
    prompts = [[5, 6, 7], [i % 40 for i in range(200)]]  # the second is cut from the left to fit
    kw = dict(pad_id=3, max_new_tokens=4, batch_size=2)
    assert generate_replies(model, prompts, stop_ids=[9], **kw) == [[0] * 4, [0] * 4]
    assert generate_replies(model, prompts, stop_ids=[9, 0], **kw) == [[], []]
