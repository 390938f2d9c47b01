"""SmolLM3 (transformers' SmolLM3ForCausalLM): Llama's layout with RoPE left out of the layers whose
`no_rope_layers` flag is 0 (`model.nope_layers` in llmkit). Tiny random models built and saved by
transformers, imported by llmkit, for several patterns: logits to 1e-4 in fp32 on full, left- and
right-padded batches; 64 greedy tokens equal to transformers' generate on prompts of different
lengths (KV cache, shared-prefix prefill); one SFT step's gradients equal to transformers' backward;
LoRA SFT through the CLI; the chat template's reasoning switches rendered as transformers renders
them; export to transformers and to llama.cpp's `smollm3` GGUF layout, or a refusal naming why."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from llmkit.model.decoding import generate
from llmkit.errors import ConfigError
from llmkit.hf.import_ import read_hf_weights
from llmkit.hf.mapping import from_hf_config, from_hf_state_dict, hf_family, to_hf_config
from llmkit.tokenizers.tokenizer_json import HFTokenizer
from llmkit.model.transformer import Transformer
from llmkit.model.config import ModelConfig
from tests.tokenizers.test_tokenizer_json import save_folder, train_bpe
from tests.train.posttrain_fixtures import lora_sft_on_import

runner = CliRunner()
TEMPLATE = (Path(__file__).parents[1] / "assets" / "smollm3_chat_template.jinja").read_text(encoding="utf-8")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
SHAPE = dict(vocab_size=832, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)  # its defaults are Llama 3's ids
PATTERNS = {  # transformers' flags, 1 = the layer uses RoPE; None = its default, every 4th layer without
    "every-4th": None,
    "all-rope": [1, 1, 1, 1],
    "alternating": [0, 1, 0, 1],
    "all-nope": [0, 0, 0, 0],
}

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py


def invoke(*args, code=0):
    r = runner.invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r.output


def save_smollm3(folder: Path, flags: list[int] | None, seed: int = 0):
    """transformers' SmolLM3 with random weights (norms away from 1), saved with its tokenizer."""
    settings = {} if flags is None else dict(no_rope_layers=flags)
    torch.manual_seed(seed)
    hf = transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(**SHAPE, **settings)).float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    hf.save_pretrained(folder)
    save_folder(folder, train_bpe(SPECIALS), TEMPLATE, eos_token="<|im_end|>", pad_token="<|end_of_text|>")
    return hf


@pytest.fixture(scope="module", params=list(PATTERNS))
def smollm3(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, save_smollm3(folder, PATTERNS[request.param]), folder


def llmkit_model(folder, **change) -> Transformer:
    cfg = from_hf_config(json.loads((folder / "config.json").read_text()))
    model = Transformer(dataclasses.replace(cfg, **change))
    model.load_state_dict(from_hf_state_dict(read_hf_weights(folder), cfg))
    return model.eval()


def random_ids(batch=2, length=40, seed=1):
    return torch.randint(0, SHAPE["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def test_the_nope_layers_are_the_layers_transformers_leaves_without_rope(smollm3):
    name, hf, folder = smollm3
    flags = hf.config.no_rope_layers
    assert llmkit_model(folder).config.nope_layers == ([i for i, f in enumerate(flags) if not f] or None)
    uses_rope = [layer.self_attn.uses_rope for layer in llmkit_model(folder).model.layers]
    assert uses_rope == [bool(f) for f in flags] == [bool(layer.self_attn.use_rope) for layer in hf.model.layers]


@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_logits_equal_transformers(smollm3, padding):
    name, hf, folder = smollm3
    ids = random_ids()
    mask = torch.ones_like(ids)
    if padding == "left":
        mask[0, :7] = 0
    elif padding == "right":
        mask[1, -9:] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours = llmkit_model(folder)(ids, attention_mask=None if padding == "none" else mask)
        theirs = hf(ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    assert (ours[real] - theirs[real]).abs().max().item() < 1e-4, (name, padding)


def test_the_pattern_is_what_makes_them_equal(smollm3):
    """The parity above is evidence only because the NoPE layers matter: RoPE in every layer (or, for
    the all-RoPE model, none in the first) differs by far more than the tolerance."""
    name, hf, folder = smollm3
    other = None if llmkit_model(folder).config.nope_layers else [0]
    with torch.no_grad():
        diff = (llmkit_model(folder, nope_layers=other)(random_ids()) - hf(random_ids()).logits).abs().max().item()
    assert diff > 1e-3, (name, diff)


def test_64_greedy_tokens_on_prompts_of_different_lengths_equal_transformers_generate(smollm3):
    """Left-padded prompts of 6, 11 and 17 tokens sharing their first 4 (prefilled once, then each
    row's rest after it in the cache: a NoPE layer reads no position, only the mask)."""
    name, hf, folder = smollm3
    prefix = random_ids(1, 4, seed=2)[0].tolist()
    rows = [prefix + random_ids(1, n, seed=3 + n)[0].tolist() for n in (2, 7, 13)]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    ours = generate(llmkit_model(folder), ids, 64, greedy=True, attention_mask=mask)[:, width:]
    with torch.no_grad():
        theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[:, width:]
    assert ours.tolist() == theirs.tolist(), name


def test_one_sft_step_gradients_equal_transformers_backward(smollm3):
    """The loss on the reply tokens only (the prompt's targets are -100), as sft computes it."""
    name, hf, folder = smollm3
    ids = random_ids(2, 24, seed=4)
    labels = ids.clone()
    labels[:, :10] = -100  # the prompt
    ours = llmkit_model(folder).train()
    ours(ids, targets=torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)).backward()
    theirs = transformers.SmolLM3ForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    logits = theirs(ids).logits
    F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)).backward()
    their_grads = dict(theirs.named_parameters())
    worst = 0.0
    for key, p in ours.named_parameters():
        g = their_grads[key].grad
        worst = max(worst, ((p.grad - g).abs().max() / g.abs().max()).item())
    assert worst <= 1e-4, (name, worst)


def test_lora_sft_runs_on_an_imported_smollm3_and_changes_its_replies(tmp_path):
    """`llmkit sft --set lora.r=4` on the chat template's /no_think mode (its system message): the
    adapters of a NoPE layer and of a RoPE layer learn."""
    save_smollm3(tmp_path / "hf", None)
    ws = tmp_path / "ws"
    adapters = lora_sft_on_import(tmp_path / "hf", ws, system="/no_think")
    for layer in (2, 3):  # layer 3 has no RoPE
        b = next(v for k, v in adapters.items() if f"layers.{layer}.self_attn.q_proj.lora_B" in k)
        assert b.abs().sum() > 0, layer  # zero before training
    (base, _), (tuned, _) = llmkit.load(ws / "base"), llmkit.load(ws / "sft")
    with torch.no_grad():
        assert (base(random_ids()) - tuned(random_ids())).abs().max() > 1e-3


# -- the chat template -------------------------------------------------------------------------

CHATS = {
    "no system": [{"role": "user", "content": "What is 2+2?"}],
    "/no_think": [{"role": "system", "content": "Be brief. /no_think"}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}],
    "/think": [{"role": "system", "content": "/think"}, {"role": "user", "content": "2+2?"},
               {"role": "assistant", "content": "\n<think>add</think>\n4"}],
    "/system_override": [{"role": "system", "content": "/system_override You are terse."},
                         {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    "tool": [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "<tool_call>w()</tool_call>"},
             {"role": "tool", "content": "sunny"}],
}


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("smollm3-tokenizer")
    return save_folder(folder, train_bpe(SPECIALS), TEMPLATE, eos_token="<|im_end|>", pad_token="<|end_of_text|>")


@pytest.mark.parametrize("chat", list(CHATS))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_the_template_renders_and_encodes_as_apply_chat_template(tokenizer_folder, chat, add_generation_prompt):
    ours, theirs = HFTokenizer(tokenizer_folder), transformers.AutoTokenizer.from_pretrained(tokenizer_folder)
    messages = CHATS[chat]
    text = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.format_chat(messages, add_generation_prompt) == text
    ids, mask = ours.encode_chat(messages, add_generation_prompt)
    encoded = theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                         return_dict=True, return_assistant_tokens_mask=True)
    assert ids == list(encoded["input_ids"]) and mask == list(encoded["assistant_masks"])


def test_no_think_in_the_system_message_is_enable_thinking_false(tokenizer_folder):
    """llmkit passes a template no `enable_thinking`; SmolLM3's own switch in the system message
    renders what transformers' enable_thinking=False renders."""
    ours, theirs = HFTokenizer(tokenizer_folder), transformers.AutoTokenizer.from_pretrained(tokenizer_folder)
    user = [{"role": "user", "content": "2+2?"}]
    off = theirs.apply_chat_template(user, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert ours.format_chat([{"role": "system", "content": "/no_think"}, *user], True) == off
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n") and "Reasoning Mode: /no_think" in off
    assert "Reasoning Mode: /think" in ours.format_chat(user, True)  # the template's default


# -- config and export ---------------------------------------------------------------------------

def tiny_config(**overrides) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=96, hidden_size=32, n_layers=4, n_heads=2, n_kv_heads=1,
                                 intermediate_size=64, max_seq_len=64), **overrides})


def test_an_llmkit_model_with_nope_layers_exports_as_smollm3_with_transformers_logits():
    torch.manual_seed(0)
    model = Transformer(tiny_config(nope_layers=[1, 3], init_std=0.2)).eval()
    hf_config = to_hf_config(model.config)
    assert hf_config["architectures"] == ["SmolLM3ForCausalLM"] and hf_config["no_rope_layers"] == [1, 0, 1, 0]
    assert from_hf_config(hf_config) == model.config
    theirs = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**hf_config),
                                                           dtype=torch.float32).eval()
    theirs.load_state_dict(model.state_dict())
    ids = torch.randint(0, 96, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(ids) - theirs(ids).logits).abs().max() < 1e-4


def test_nope_layers_are_checked_and_normalised():
    assert tiny_config(nope_layers=[3, 1]).nope_layers == [1, 3]
    assert tiny_config(nope_layers=[]).nope_layers is None
    for bad in ([4], [-1], [1, 1], ["1"]):
        with pytest.raises(ConfigError, match="model.nope_layers must list distinct layer indices in 0..3"):
            tiny_config(nope_layers=bad)
    with pytest.raises(ConfigError, match="a llama model cannot have nope_layers=\\[1\\]"):
        hf_family(tiny_config(nope_layers=[1], family="llama"))


def test_the_interval_gives_the_layers_smollm3config_derives():
    for n_layers, interval in [(8, 4), (6, 2), (3, 4), (5, 1)]:
        config = transformers.SmolLM3Config(**{**SHAPE, "num_hidden_layers": n_layers},
                                            no_rope_layer_interval=interval).to_dict()
        expected = [i for i, f in enumerate(config.pop("no_rope_layers")) if not f] or None
        assert from_hf_config(config).nope_layers == expected, (n_layers, interval)


@pytest.mark.parametrize("change, named", [
    (dict(use_sliding_window=True, sliding_window=8, layer_types=["full_attention", "sliding_attention"] * 2),
     "SmolLM3's sliding_attention layers"),
    (dict(no_rope_layers=[1, 1]), "no_rope_layers has 2 flags for num_hidden_layers=4"),
    (dict(attention_bias=True), "attention_bias=True (smollm3 biases o_proj too)"),
    (dict(mlp_bias=True), "mlp_bias=True"),
])
def test_what_llmkit_does_not_implement_of_smollm3_is_refused_by_name(change, named):
    hf = {**transformers.SmolLM3Config(**SHAPE).to_dict(), **change}
    with pytest.raises(ConfigError) as e:
        from_hf_config(hf)
    assert named in str(e.value)


def test_gguf_export_writes_llama_cpps_smollm3_layout_and_refuses_other_patterns(tmp_path):
    """llama.cpp's smollm3 graph is its llama graph with RoPE left out where (layer + 1) % 4 == 0, fixed
    in its code: the file says `smollm3` and holds the llama layout (q/k rows permuted); another
    pattern exits 2 naming it. transformers reads no smollm3 GGUF file: export says it did not read it
    back; llmkit's import reads it (tests/hf/test_gguf_import_hybrid.py)."""
    import gguf
    import numpy as np

    from llmkit.hf.gguf_export import permute_rotary_rows

    save_smollm3(tmp_path / "every-4th", None)
    save_smollm3(tmp_path / "alternating", PATTERNS["alternating"])
    ws = tmp_path / "ws"
    for name in ("every-4th", "alternating"):
        invoke("import", "--from", tmp_path / name, "--out", name, "-w", ws)
    output = invoke("export", "--from", "every-4th", "--format", "gguf", "--to", tmp_path / "gguf", "-w", ws)
    assert "not read back" in output
    reader = gguf.GGUFReader(str(tmp_path / "gguf" / "model-f16.gguf"))
    fields = {k: f.contents() for k, f in reader.fields.items()
              if not f.types or f.types[0] != gguf.GGUFValueType.ARRAY}
    assert fields["general.architecture"] == "smollm3" and fields["smollm3.block_count"] == 4
    assert "[:]" not in fields["tokenizer.chat_template"] and "xml_tools" in fields["tokenizer.chat_template"]
    allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.SMOLLM3]}
    tensors = {t.name: t for t in reader.tensors}
    assert {re.sub(r"^blk\.\d+\.", "blk.{bid}.", n.removesuffix(".weight")) for n in tensors} <= allowed
    model, _ = llmkit.load(ws / "every-4th")
    q = model.state_dict()["model.layers.3.self_attn.q_proj.weight"].numpy()
    stored = np.asarray(tensors["blk.3.attn_q.weight"].data, dtype=np.float32).reshape(q.shape)
    assert np.abs(stored - permute_rotary_rows(q, SHAPE["num_attention_heads"])).max() < 1e-3
    record = json.loads((tmp_path / "gguf" / "llmkit_export.json").read_text())
    assert record["architecture"] == "smollm3" and record["max_abs_logit_diff"] is None
    invoke("import", "--from", tmp_path / "gguf" / "model-f16.gguf", "--out", "back", "-w", ws)  # llmkit reads it
    refused = invoke("export", "--from", "alternating", "--format", "gguf", "--to", tmp_path / "no", "-w", ws, code=2)
    assert "without RoPE are [0, 2]" in refused and "every 4th layer" in refused
    assert not (tmp_path / "no").exists()
