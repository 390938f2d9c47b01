"""Qwen3.5 (Gated DeltaNet layers beside gated full attention): tiny random models built and saved by
transformers' own Qwen3_5ForCausalLM, read by llmkit.hf.mapping, give transformers' logits to 1e-4 in
fp32 for several `layer_types` patterns (3 linear : 1 full, all linear, all full) with GQA and
partial rotary, on a sequence longer than a delta-rule chunk and on left- and right-padded batches;
their greedy tokens with the KV cache and recurrent states equal transformers' generate; the
multimodal folder (`qwen3_5`, a vision tower beside) imports its language model; export goes back
to a folder transformers reads with the same logits."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
import transformers
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from llmkit.model.decoding import generate
from llmkit.errors import ConfigError
from llmkit.model.gated_deltanet import CHUNK_SIZE
from llmkit.hf.import_ import read_hf_weights
from llmkit.hf.mapping import from_hf_config, from_hf_state_dict, to_hf_config
from llmkit.model.transformer import Transformer
from llmkit.model.config import ModelConfig
from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe
from tests.train.posttrain_fixtures import lora_sft_on_import

LINEAR, FULL = "linear_attention", "full_attention"
SHAPE = dict(vocab_size=832, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=256, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4, tie_word_embeddings=False)
PATTERNS = {"three-linear-one-full": [LINEAR, LINEAR, LINEAR, FULL], "all-linear": [LINEAR, LINEAR],
            "all-full": [FULL, FULL]}
LONG = 2 * CHUNK_SIZE - 27  # longer than a chunk, not a multiple of it

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py


def invoke(*args, code=0):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r.output


def save_qwen35(folder, layer_types, seed=0, **settings):
    """transformers' Qwen3_5ForCausalLM with random weights (see `perturbed`), saved with a tokenizer."""
    torch.manual_seed(seed)
    hf = perturbed(transformers.Qwen3_5ForCausalLM(text_config(layer_types, **settings)))
    hf.save_pretrained(folder)
    save_folder(folder, train_bpe(QWEN_SPECIALS), QWEN25_TEMPLATE, eos_token="<|im_end|>")
    return hf


def text_config(layer_types, **settings):
    return transformers.Qwen3_5TextConfig(**{**SHAPE, "num_hidden_layers": len(layer_types),
                                             "layer_types": layer_types, **settings})


def perturbed(model):
    """Every one-dimensional parameter (norms, decay rates, dt_bias) moved off its initial value, so
    that a detail llmkit got wrong about them would show."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module", params=list(PATTERNS))
def qwen35(request, tmp_path_factory):
    """(pattern, transformers' Qwen3_5ForCausalLM in fp32, its saved folder)."""
    torch.manual_seed(0)
    hf = perturbed(transformers.Qwen3_5ForCausalLM(text_config(PATTERNS[request.param])))
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return request.param, hf, folder


def llmkit_model(folder, **change) -> Transformer:
    cfg = from_hf_config(json.loads((folder / "config.json").read_text()))
    model = Transformer(dataclasses.replace(cfg, **change))
    model.load_state_dict(from_hf_state_dict(read_hf_weights(folder), cfg))
    return model.eval()


def ids(batch=2, length=LONG, seed=1):
    return torch.randint(0, SHAPE["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def test_the_config_reads_every_qwen3_5_field(qwen35):
    name, hf, folder = qwen35
    cfg = from_hf_config(json.loads((folder / "config.json").read_text()))
    assert (cfg.qk_norm, cfg.attention_output_gate, cfg.zero_centred_norm) == (True, True, True)
    assert cfg.rotary_dim == 4 and cfg.head_dim == 16 and cfg.n_kv_heads == 2  # partial rotary, GQA
    assert cfg.layer_types == (PATTERNS[name] if LINEAR in PATTERNS[name] else None)
    assert (cfg.linear_n_key_heads, cfg.linear_n_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim,
            cfg.linear_conv_kernel) == (2, 4, 16, 8, 4)


def test_logits_equal_transformers_on_a_sequence_longer_than_a_chunk(qwen35):
    name, hf, folder = qwen35
    x = ids()
    with torch.no_grad():
        assert max_diff(llmkit_model(folder)(x), hf(x, use_cache=False).logits) < 1e-4, name


def test_logits_equal_transformers_on_left_and_right_padded_batches(qwen35):
    name, hf, folder = qwen35
    x = ids(batch=3, length=CHUNK_SIZE + 16)
    mask = torch.ones_like(x)
    mask[0, :9] = 0  # left padding, as generation has it
    mask[1, -13:] = 0  # right padding, as training batches have it
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours = llmkit_model(folder)(x, attention_mask=mask)
        theirs = hf(x, attention_mask=mask, position_ids=positions, use_cache=False).logits
        alone = llmkit_model(folder)(x[:1, 9:])  # the left-padded row computed without its padding
    real = mask.bool()
    assert max_diff(ours[real], theirs[real]) < 1e-4, name
    assert max_diff(ours[0, 9:], alone[0]) < 1e-4, name


def test_packed_documents_give_the_logits_each_gives_alone(qwen35):
    """SFT packing: documents side by side in one row (doc_ids, positions restarting) see nothing
    of each other, in the attention layers (the mask) and in the Gated DeltaNet ones (state cut)."""
    name, _, folder = qwen35
    docs = [ids(1, n, seed=n) for n in (CHUNK_SIZE - 5, 30, 17)]
    doc_ids = torch.cat([torch.full((d.shape[1],), i) for i, d in enumerate(docs)])[None]
    positions = torch.cat([torch.arange(d.shape[1]) for d in docs])[None]
    model = llmkit_model(folder)
    with torch.no_grad():
        packed = model(torch.cat(docs, dim=1), positions, doc_ids)
        alone = torch.cat([model(d) for d in docs], dim=1)
    assert max_diff(packed, alone) < 1e-4, name


# rotary_fraction only where a layer rotates (all-linear has no attention layer)
@pytest.mark.parametrize("qwen35, change", [(p, c) for p in PATTERNS for c in (dict(zero_centred_norm=False),
                                                                              dict(rotary_fraction=1.0))
                                            if not (p == "all-linear" and "rotary_fraction" in c)],
                         indirect=["qwen35"])
def test_each_qwen3_5_detail_switched_off_changes_the_logits(qwen35, change):
    name, hf, folder = qwen35
    x = ids(length=24)
    with torch.no_grad():
        assert max_diff(llmkit_model(folder, **change)(x), hf(x, use_cache=False).logits) > 1e-3, (name, change)


def test_greedy_tokens_equal_transformers_generate_on_prompts_of_different_lengths(qwen35):
    """Left-padded prompts that share their first tokens (as a chat template's system turn), decoded
    with the KV cache of the full-attention layers and the conv and delta-rule states of the linear
    ones; 64 new tokens."""
    name, hf, folder = qwen35
    prompts = [torch.cat([ids(1, 6)[0], ids(1, n, seed=n)[0]]) for n in (2, 19, 12)]
    width = max(len(p) for p in prompts)
    x = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(x)
    for row, p in enumerate(prompts):
        x[row, width - len(p):], mask[row, width - len(p):] = p, 1
    ours = generate(llmkit_model(folder), x, 64, greedy=True, attention_mask=mask)[:, width:]
    with torch.no_grad():
        if name == "all-linear":  # transformers 5.25's generate needs an attention layer in its cache
            theirs = greedy_without_cache(hf, x, mask, 64)
        else:
            theirs = hf.generate(x, attention_mask=mask, max_new_tokens=64, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)[:, width:]
    assert ours.tolist() == theirs.tolist(), name


def test_sampling_with_a_seed_repeats_its_tokens(qwen35):
    """The same seed draws the same 32 tokens for each of a batch of prompts of different lengths,
    also after a call with another seed (no state left behind in the model); another seed draws others."""
    _, _, folder = qwen35
    model = llmkit_model(folder)
    x = torch.stack([ids(1, 12)[0], torch.cat([torch.zeros(7, dtype=torch.long), ids(1, 5, seed=5)[0]])])
    mask = (torch.arange(12) >= torch.tensor([[0], [7]])).long()

    def sampled(seed):
        return generate(model, x, 32, temperature=1.0, attention_mask=mask,
                        generator=torch.Generator().manual_seed(seed))[:, 12:].tolist()

    first, other, again = sampled(0), sampled(1), sampled(0)
    assert first == again and first != other


def greedy_without_cache(hf, x, mask, n):
    """n greedy tokens from transformers' forward over the whole sequence at every step."""
    new = []
    for _ in range(n):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = hf(x, attention_mask=mask, position_ids=positions, use_cache=False).logits[:, -1]
        new.append(logits.argmax(-1))
        x, mask = torch.cat([x, new[-1][:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return torch.stack(new, 1)


def test_the_multimodal_folder_imports_its_language_model(tmp_path):
    """A `qwen3_5` folder (Qwen3_5ForConditionalGeneration: a vision tower beside the language model)
    imports the language model, says the vision tower was left out, and gives transformers' text-only
    logits."""
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=1, num_position_embeddings=16)
    text = text_config(PATTERNS["three-linear-one-full"]).to_dict()
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    hf = perturbed(transformers.Qwen3_5ForConditionalGeneration(config))
    hf.save_pretrained(tmp_path / "qwen35-vl")
    save_folder(tmp_path / "qwen35-vl", train_bpe(QWEN_SPECIALS), QWEN25_TEMPLATE, eos_token="<|im_end|>")
    output = invoke("import", "--from", tmp_path / "qwen35-vl", "-w", tmp_path / "ws")
    assert "the vision tower" in output and "left out" in output
    model, _ = llmkit.load(tmp_path / "ws" / "imported")
    x = ids()
    with torch.no_grad():
        assert max_diff(model(x), hf(input_ids=x).logits) < 1e-4


def test_import_export_round_trips_and_transformers_reads_the_export(tmp_path):
    hf = save_qwen35(tmp_path / "qwen35", PATTERNS["three-linear-one-full"])
    ws, out = tmp_path / "ws", tmp_path / "export"
    invoke("import", "--from", tmp_path / "qwen35", "--out", "run", "-w", ws)
    invoke("export", "--from", "run", "--to", out, "-w", ws)
    invoke("import", "--from", out, "--out", "back", "-w", ws)
    record = json.loads((out / "llmkit_export.json").read_text())
    assert record["architecture"] == "Qwen3_5ForCausalLM" and record["max_abs_logit_diff"] < 1e-4
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    x = ids()
    with torch.no_grad():
        assert max_diff(exported(x).logits, hf(x).logits) < 1e-4
    run, back = llmkit.load(ws / "run")[0].state_dict(), llmkit.load(ws / "back")[0].state_dict()
    assert run.keys() == back.keys() and all(torch.equal(run[k], back[k]) for k in run)


def test_the_export_config_is_transformers_qwen3_5():
    cfg = from_hf_config(text_config(PATTERNS["three-linear-one-full"]).to_dict())
    exported = to_hf_config(cfg)
    assert exported["model_type"] == "qwen3_5_text" and exported["architectures"] == ["Qwen3_5ForCausalLM"]
    assert from_hf_config(exported) == cfg


def test_a_fresh_model_starts_as_transformers_initialises_qwen3_5():
    cfg = from_hf_config(text_config(PATTERNS["three-linear-one-full"]).to_dict())
    model = Transformer(cfg)
    model.init_weights(seed=0)
    sd = model.state_dict()
    assert torch.all(sd["model.norm.weight"] == 0) and torch.all(sd["model.layers.3.self_attn.q_norm.weight"] == 0)
    assert torch.all(sd["model.layers.0.linear_attn.norm.weight"] == 1)
    A = sd["model.layers.0.linear_attn.A_log"].exp()
    assert torch.all((A >= 0.01) & (A <= 16)) and len(set(A.tolist())) == len(A)


@pytest.mark.parametrize("change, key", [
    (dict(layer_types=["linear_attention", "sliding_attention"]), "layer_types"),
    (dict(layer_types=["linear_attention"]), "layer_types"),
    (dict(layer_types=["linear_attention", "full_attention"], linear_n_value_heads=3), "linear_n_value_heads"),
    (dict(rotary_fraction=0.1), "rotary_fraction"),
])
def test_a_config_llmkit_cannot_build_names_the_key(change, key):
    with pytest.raises(ConfigError, match=key):
        ModelConfig(**{**dict(vocab_size=64, hidden_size=32, n_layers=2, n_heads=2, n_kv_heads=1,
                              intermediate_size=64, linear_n_key_heads=2), **change})


def test_a_folder_missing_a_linear_attention_tensor_is_refused_by_name(tmp_path):
    from safetensors.torch import load_file, save_file

    save_qwen35(tmp_path / "qwen35", PATTERNS["all-linear"])
    weights = load_file(tmp_path / "qwen35" / "model.safetensors")
    del weights["model.layers.1.linear_attn.in_proj_a.weight"]
    save_file(weights, tmp_path / "qwen35" / "model.safetensors", metadata={"format": "pt"})
    output = invoke("import", "--from", tmp_path / "qwen35", "-w", tmp_path / "ws", code=2)
    assert "model.layers.1.linear_attn.in_proj_a.weight" in output
    assert not (tmp_path / "ws" / "imported").exists()


def test_one_sft_step_has_transformers_gradients(qwen35):
    name, _, folder = qwen35
    x = ids(length=CHUNK_SIZE + 9)
    labels = x.clone()
    labels[:, :10] = -100  # the prompt
    ours = llmkit_model(folder).train()
    ours(x, targets=torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)).backward()
    theirs = transformers.Qwen3_5ForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    logits = theirs(x, use_cache=False).logits
    F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)).backward()
    their_grads = dict(theirs.named_parameters())
    # relative to each tensor's largest gradient, or to 1e-4 where that is smaller: a layer whose state
    # decays fast gives its A_log and dt_bias gradients of 1e-7 to 1e-5, where the ~1e-9 noise of
    # fp32 sums (either side's) is a sizeable share; the other gradients here are 1e-4 to 1e-1
    worst = max(((p.grad - their_grads[k].grad).abs().max() / their_grads[k].grad.abs().max().clamp(min=1e-4)).item()
                for k, p in ours.named_parameters())
    assert worst <= 1e-4, (name, worst)


def test_lora_sft_on_packed_chats_trains_the_linear_attention_projections(tmp_path):
    """`llmkit sft --set lora.r=4` (packing on: the Gated DeltaNet layers see each chat alone):
    all-linear LoRA puts adapters on the linear-attention projections too, and they learn."""
    save_qwen35(tmp_path / "hf", [LINEAR, FULL])
    ws = tmp_path / "ws"
    adapters = lora_sft_on_import(tmp_path / "hf", ws)
    for module in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
        b = next(v for k, v in adapters.items() if f"layers.0.linear_attn.{module}.lora_B" in k)
        assert b.abs().sum() > 0, module  # zero before training
    (base, _), (tuned, _) = llmkit.load(ws / "base"), llmkit.load(ws / "sft")
    with torch.no_grad():
        assert max_diff(base(ids()), tuned(ids())) > 1e-3


def test_flops_count_the_attention_term_of_the_full_attention_layers_only():
    cfg = from_hf_config(text_config(PATTERNS["three-linear-one-full"]).to_dict())
    model, seq = Transformer(cfg), 1000
    n = model.num_parameters() - model.model.embed_tokens.weight.numel()  # untied: the lookup is no matmul
    assert model.flops_per_token(seq) == 6 * n + 12 * 1 * cfg.n_heads * cfg.head_dim * seq  # one of four attends


def test_the_harness_scores_a_hybrid_model_without_sharing_prefixes(qwen35):
    """A linear-attention layer's state is not a prefix's keys and values: lm-eval requests that
    share a few-shot prefix are scored whole, as each alone."""
    import contextlib

    from llmkit.eval.harness_scoring import PrefixScorer
    from llmkit.model.lm_scoring import LMScorer

    model = llmkit_model(qwen35[2])
    shot = ids(1, 40, seed=3)[0].tolist()
    requests = [(shot + ids(1, 6, seed=s)[0].tolist(), 3) for s in range(4)]
    ours = PrefixScorer(model, torch.device("cpu"), contextlib.nullcontext, batch_tokens=200).score(requests)
    alone = LMScorer(model, device="cpu", batch_tokens=1).target_logprobs(requests)
    assert max(abs(lp - ref) for (lp, _), ref in zip(ours, alone)) < 1e-4
