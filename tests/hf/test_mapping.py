"""The public families llmkit imports (Qwen2 tied and untied, Qwen3 with its own head_dim, Llama with
llama3 RoPE scaling, a SmolLM2-shaped Llama, SmolLM3 with a NoPE layer, Mistral with a window,
Mixtral): tiny random models built and saved by transformers, read by llmkit.hf.mapping, give
transformers' logits to 1e-4 in fp32 and its greedy tokens; each delta switched off makes them
differ. Mistral and Mixtral come with the tokenizer files their published folders have
(`tokenizer.model` beside `tokenizer.json`)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import transformers

from llmkit.model.decoding import generate
from llmkit.errors import ConfigError
from llmkit.hf.import_ import read_hf_weights
from llmkit.hf.mapping import from_hf_config, from_hf_state_dict, to_hf_config
from llmkit.model.config import ModelConfig
from llmkit.model.transformer import Transformer, rope_tables
from tests.tokenizers.test_tokenizer_json import (PROBE_TEXTS, QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, save_mistral_folder,
                                     train_bpe)


SHAPE = dict(vocab_size=832, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 24}
FAMILIES = {  # name -> (transformers config class, its settings, the ModelConfig field of the delta)
    "qwen2-tied": ("Qwen2Config", dict(tie_word_embeddings=True), "attention_bias"),
    "qwen2-untied": ("Qwen2Config", dict(tie_word_embeddings=False), "attention_bias"),
    "qwen3-head-dim": ("Qwen3Config", dict(head_dim=24, tie_word_embeddings=True), "qk_norm"),
    "llama3-rope": ("LlamaConfig", dict(rope_parameters=LLAMA3_ROPE, tie_word_embeddings=False), "rope_scaling"),
    "smollm2": ("LlamaConfig", dict(rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                                    tie_word_embeddings=True, num_key_value_heads=4), "rope_theta"),
    "mistral-window": ("MistralConfig", dict(sliding_window=8, tie_word_embeddings=False), "sliding_window"),
    "smollm3-nope": ("SmolLM3Config", dict(no_rope_layers=[1, 0], tie_word_embeddings=True, pad_token_id=None,
                                           bos_token_id=None, eos_token_id=None), "nope_layers"),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False),
                "experts_top_k"),
}
OFF = {"attention_bias": False, "qk_norm": False, "rope_scaling": None, "rope_theta": 10000.0,
       "sliding_window": None, "experts_top_k": 1, "nope_layers": None}
TWO_TOKENIZER_FILES = {"mistral-window", "mixtral"}  # sentencepiece and tokenizer.json, as published


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, transformers model in fp32, its folder): random weights, every norm and bias perturbed
    so that a delta llmkit ignored would show."""
    cls, settings, delta = FAMILIES[request.param]
    config = getattr(transformers, cls)(**{**SHAPE, **settings})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    if request.param in TWO_TOKENIZER_FILES:
        save_mistral_folder(folder)
    else:
        save_folder(folder, train_bpe(QWEN_SPECIALS), QWEN25_TEMPLATE, eos_token="<|im_end|>")
    return request.param, model, folder, delta


def llmkit_model(folder, **change) -> Transformer:
    cfg = from_hf_config(json.loads((folder / "config.json").read_text()))
    model = Transformer(dataclasses.replace(cfg, **change))
    model.load_state_dict(from_hf_state_dict(read_hf_weights(folder), cfg), strict=not change)
    return model.eval()


def batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, SHAPE["vocab_size"], (2, 40), generator=generator)


def test_logits_equal_transformers_on_a_full_sequence(family):
    name, hf, folder, _ = family
    ids = batch()
    with torch.no_grad():
        diff = (llmkit_model(folder)(ids) - hf(ids).logits).abs().max().item()
    assert diff < 1e-4, (name, diff)


def test_logits_equal_transformers_on_a_left_padded_batch(family):
    name, hf, folder, _ = family
    ids = batch()
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours = llmkit_model(folder)(ids, attention_mask=mask)
        theirs = hf(ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    assert (ours[real] - theirs[real]).abs().max().item() < 1e-4, name


def test_sixteen_greedy_tokens_with_the_kv_cache_equal_transformers(family):
    name, hf, folder, _ = family
    ids = batch()[:, :20]
    ours = generate(llmkit_model(folder), ids, 16, greedy=True)[:, 20:]
    with torch.no_grad():
        theirs = hf.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[:, 20:]
    assert ours.tolist() == theirs.tolist(), name


def test_each_delta_switched_off_changes_the_logits(family):
    """The parity above is evidence only because the delta matters: without it llmkit differs by ten
    times the tolerance or more (RoPE scaling least at 40 tokens: its tables are compared below)."""
    name, hf, folder, delta = family
    ids = batch()
    with torch.no_grad():
        diff = (llmkit_model(folder, **{delta: OFF[delta]})(ids) - hf(ids).logits).abs().max().item()
    assert diff > 1e-3, (name, delta, diff)


def test_export_config_loads_back_as_the_same_family(family):
    name, hf, folder, _ = family
    cfg = from_hf_config(json.loads((folder / "config.json").read_text()))
    exported = to_hf_config(cfg)
    assert exported["model_type"] == hf.config.model_type
    assert exported["architectures"] == [type(hf).__name__]
    assert from_hf_config(exported) == cfg
    rebuilt = transformers.AutoConfig.for_model(**exported)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in transformers.AutoModelForCausalLM.from_config(rebuilt).state_dict().items()}
    assert shapes == {k: v.shape for k, v in hf.state_dict().items()}


def test_import_export_import_round_trips_and_transformers_loads_the_export(family, tmp_path):
    from typer.testing import CliRunner

    import llmkit
    from llmkit.cli.app import build_app

    name, hf, folder, _ = family
    ws, out = tmp_path / "ws", tmp_path / "export"
    for args in (["import", "--from", folder, "--out", "run"], ["export", "--from", "run", "--to", out],
                 ["import", "--from", out, "--out", "back"]):
        r = CliRunner().invoke(build_app(), [*map(str, args), "-w", str(ws)])
        assert r.exit_code == 0, r.output
    record = json.loads((out / "llmkit_export.json").read_text())
    assert record["architecture"] == type(hf).__name__ and record["max_abs_logit_diff"] < 1e-4
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = batch()
    with torch.no_grad():
        assert (exported(ids).logits - hf(ids).logits).abs().max() < 1e-4
    run, back = llmkit.load(ws / "run")[0].state_dict(), llmkit.load(ws / "back")[0].state_dict()
    assert run.keys() == back.keys() and all(torch.equal(run[k], back[k]) for k in run)


def test_the_imported_run_gives_transformers_logits_and_autotokenizer_ids(family, tmp_path):
    """What `llmkit import` makes of the folder: transformers' logits, and the ids AutoTokenizer gives
    on the same folder (for Mistral its tokenizer.json, as AutoTokenizer reads it)."""
    from transformers import AutoTokenizer
    from typer.testing import CliRunner

    import llmkit
    from llmkit.cli.app import build_app

    name, hf, folder, _ = family
    r = CliRunner().invoke(build_app(), ["import", "--from", str(folder), "-w", str(tmp_path)])
    assert r.exit_code == 0, r.output
    model, tokenizer = llmkit.load(tmp_path / "imported")
    ids = batch()
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max().item() < 1e-4, name
    theirs = AutoTokenizer.from_pretrained(folder)
    assert [tokenizer.encode(t) for t in PROBE_TEXTS] == [theirs.encode(t, add_special_tokens=False)
                                                          for t in PROBE_TEXTS], name


def test_llama3_rope_tables_equal_transformers_beyond_the_original_context():
    config = transformers.LlamaConfig(**{**SHAPE, "max_position_embeddings": 512}, rope_parameters=LLAMA3_ROPE)
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    positions = torch.arange(512)[None]
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    ours_cos, ours_sin = rope_tables(from_hf_config(config.to_dict()))
    assert (ours_cos - cos[0]).abs().max() < 1e-5 and (ours_sin - sin[0]).abs().max() < 1e-5
    plain_cos, _ = rope_tables(dataclasses.replace(from_hf_config(config.to_dict()), rope_scaling=None))
    assert (plain_cos[400:] - cos[0, 400:]).abs().max() > 0.1  # the scaling is what makes them equal


@pytest.mark.parametrize("settings, window", [
    (dict(use_sliding_window=False, sliding_window=16, max_window_layers=0), None),
    (dict(use_sliding_window=True, sliding_window=16, max_window_layers=2), None),  # from layer 2 of 2: none
    (dict(use_sliding_window=True, sliding_window=16, max_window_layers=0), 16),
])
def test_qwen2_windows_attention_only_with_use_sliding_window(settings, window):
    hf = transformers.Qwen2Config(**SHAPE, **settings).to_dict()
    assert from_hf_config(hf).sliding_window == window


@pytest.mark.parametrize("change, named", [
    (dict(model_type="gemma"), "'gemma' is not supported; llmkit implements llama, mistral, mixtral, qwen2, qwen3"),
    (dict(rope_parameters={"rope_type": "proportional", "rope_theta": 1e4}), "RoPE scaling 'proportional' is not implemented"),
    (dict(use_sliding_window=True, sliding_window=16, max_window_layers=1), "layers 1.. only"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
])
def test_what_llmkit_does_not_implement_is_refused_by_name(change, named):
    hf = {**transformers.Qwen2Config(**SHAPE).to_dict(), **change}
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(".", r"\.")):
        from_hf_config(hf)


@pytest.mark.parametrize("kind", ["linear", "dynamic", "yarn", "yarn-options", "yarn-mscale", "longrope", "llama3"])
@pytest.mark.parametrize("bias", [False, True])  # exported as Llama, as Qwen2
def test_every_rope_scaling_survives_export_and_import(kind, bias):
    """ModelConfig -> config.json -> transformers' config class -> ModelConfig: the same, scaling and
    window included (dynamic's original context travels as max_position_embeddings)."""
    from tests.model.test_rope import ORIGINAL, SCALINGS

    scaling = dict(SCALINGS[kind])
    if kind == "dynamic":
        scaling["original_max_position_embeddings"] = ORIGINAL
    cfg = ModelConfig(vocab_size=64, hidden_size=64, n_heads=4, n_kv_heads=2, max_seq_len=4 * ORIGINAL,
                      attention_bias=bias, rope_scaling=scaling)
    hf = to_hf_config(cfg)
    read = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf).to_dict()
    assert read["rope_parameters"]["rope_type"] == scaling["rope_type"]
    assert from_hf_config(read) == cfg
