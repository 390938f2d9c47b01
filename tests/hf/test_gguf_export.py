"""`llmkit export --format gguf`: tiny random models of the families llmkit imports (built by
transformers' config classes, with tiny `tokenizers` tokenizers) and an llmkit model, written as
GGUF and read back by transformers (`gguf_file=`) and by `llmkit import`: the same logits over 128
tokens, the same token ids on mixed Chinese / English / code text, the same chat template and
special tokens. Quantised files are as small as the seeds ask; what llama.cpp cannot run is refused
by name."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from llmkit.hf.gguf_read import load_gguf_with_transformers, read_gguf_metadata
from llmkit.tokenizers.sentencepiece import CONFIG_FILE, MODEL_FILE, Tokenizer
from llmkit.data.tokenizer_training import TokenizerConfig, tokenizer_config_json, train_sentencepiece
from tests.hf.test_export import corpus as sentencepiece_corpus
from tests.tokenizers.test_tokenizer_json import (LLAMA3_TEMPLATE, LLAMA_SPECIALS, QWEN25_TEMPLATE, QWEN_SPECIALS,
                                     save_folder, train_bpe)
from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run

runner = CliRunner()
TOKENS = 128
MIXED = ["大语言模型的训练需要大量的中文和英文数据。 The quick brown fox, 3.14159 and 2024-01-01!",
         "def add(a, b):\n    if a > 0:\n\treturn a + b  # 中文注释\n    return 0\n",
         "  leading spaces 😀 mixed 中文 and English\tand tabs\r\n\r\nend"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2=? 用中文回答"},
        {"role": "assistant", "content": "四 (4)"}]
SHAPE = dict(vocab_size=832, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=160)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 24}
QWEN = dict(tokenizer=(QWEN_SPECIALS, None), template=QWEN25_TEMPLATE, special=dict(eos_token="<|im_end|>",
                                                                                    pad_token="<|endoftext|>"))
LLAMA = dict(tokenizer=(LLAMA_SPECIALS, "<|begin_of_text|>"), template=LLAMA3_TEMPLATE,
             special=dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"))
# name -> (transformers config class, settings, tokenizer, whether transformers' own GGUF reader can
# rebuild the model: it skips the rope_freqs tensor (Llama 3.1 RoPE scaling), reads no head_dim
# for Qwen3 (it assumes 128) and no sliding window; llmkit import restores them)
FAMILIES = {
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True), QWEN, True),
    "qwen3": ("Qwen3Config", dict(head_dim=128, tie_word_embeddings=True), QWEN, True),
    "llama3": ("LlamaConfig", dict(rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                                   tie_word_embeddings=False), LLAMA, True),
    "mistral": ("MistralConfig", dict(sliding_window=None, tie_word_embeddings=False), LLAMA, True),
    "llama3.1-rope-scaling": ("LlamaConfig", dict(rope_parameters=LLAMA3_ROPE, tie_word_embeddings=False),
                              LLAMA, False),
    "qwen3-head-dim-24": ("Qwen3Config", dict(head_dim=24, tie_word_embeddings=True), QWEN, False),
    "mistral-window-8": ("MistralConfig", dict(sliding_window=8, tie_word_embeddings=False), LLAMA, False),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py


def invoke(*args):
    r = runner.invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def ids(length=TOKENS, vocab=SHAPE["vocab_size"], seed=1):
    return torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """A transformers model folder, imported, exported as GGUF f16 and imported back."""
    cls, settings, tok, readable = FAMILIES[request.param]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**{**SHAPE, **settings}),
                                                       dtype=torch.float32).eval()
    with torch.no_grad():  # norms away from 1, so that a norm put in the wrong place shows
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    root = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(root / "hf")
    save_folder(root / "hf", train_bpe(*tok["tokenizer"]), tok["template"], **tok["special"])
    ws, out = root / "ws", root / "gguf"
    invoke("import", "--from", root / "hf", "--out", "run", "-w", ws)
    invoke("export", "--from", "run", "--format", "gguf", "--to", out, "-w", ws)
    invoke("import", "--from", out / "model-f16.gguf", "--out", "back", "-w", ws)
    return dict(name=request.param, hf=hf, folder=root / "hf", out=out, ws=ws, readable=readable,
                gguf=out / "model-f16.gguf")


def test_transformers_reads_the_gguf_with_the_same_logits(family):
    """Where FAMILIES says transformers' own reader cannot rebuild the model, it does not (a newer
    transformers that can fails this test: then say so in docs/export-import.md), and `llmkit import` does
    (the test below)."""
    try:
        theirs = transformers.AutoModelForCausalLM.from_pretrained(
            family["out"], gguf_file=family["gguf"].name, dtype=torch.float32).eval()
        with torch.no_grad():
            diff = (theirs(ids()).logits - family["hf"](ids()).logits).abs().max().item()
    except (ValueError, RuntimeError, KeyError):
        diff = float("inf")
    assert (diff <= 1e-3) == family["readable"], (family["name"], diff)


def test_llmkit_import_of_the_gguf_gives_the_same_logits_and_config(family):
    model, _ = llmkit.load(family["ws"] / "back")
    with torch.no_grad():
        diff = (model(ids()) - family["hf"](ids()).logits).abs().max().item()
    assert diff <= 1e-3, (family["name"], diff)
    first, _ = llmkit.load(family["ws"] / "run")
    assert model.config == first.config
    record = json.loads((family["out"] / "llmkit_export.json").read_text())
    assert record["max_abs_logit_diff"] <= 1e-4 and record["greedy_tokens_equal"] and record["tokenizer_identical"]


def test_tokenizer_chat_template_and_special_tokens_read_back_equal(family):
    original = transformers.AutoTokenizer.from_pretrained(family["folder"])
    readers = {"llmkit import": llmkit.load(family["ws"] / "back")[1]}
    if family["readable"]:
        readers["transformers"] = transformers.AutoTokenizer.from_pretrained(family["out"],
                                                                            gguf_file=family["gguf"].name)
        theirs = readers["transformers"]
        assert theirs.chat_template == original.chat_template
        for name in ("bos_token", "eos_token", "pad_token"):
            assert getattr(theirs, name) == getattr(original, name), name
        assert (list(theirs.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True)["input_ids"])
                == list(original.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True)["input_ids"]))
        assert [theirs(t)["input_ids"] for t in MIXED] == [original(t)["input_ids"] for t in MIXED]
    ours = readers["llmkit import"]
    assert [ours.encode(t) for t in MIXED] == [original.encode(t, add_special_tokens=False) for t in MIXED]
    assert ours.encode_chat(CHAT)[0] == list(original.apply_chat_template(CHAT, tokenize=True)["input_ids"])


def test_the_file_holds_what_llama_cpp_reads(family):
    meta = read_gguf_metadata(family["gguf"])
    arch = {"qwen2": "qwen2", "qwen3": "qwen3"}.get(family["name"].split("-")[0], "llama")
    assert meta["general.architecture"] == arch and meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.ggml.pre"] == "qwen2"  # the tiny tokenizers split text with Qwen2's regex
    assert meta[f"{arch}.block_count"] == 2 and meta[f"{arch}.attention.head_count_kv"] == 2
    config = json.loads((family["folder"] / "config.json").read_text())
    assert meta[f"{arch}.attention.key_length"] == config.get("head_dim") or 16
    window = config.get("sliding_window")
    assert meta[f"{arch}.context_length"] == min(160, window or 160)  # llama.cpp attends to all of it


def test_llama3_rope_scaling_is_the_rope_freqs_tensor_llama_cpp_divides_by():
    """llama.cpp divides each rotary frequency by rope_freqs; transformers' llama3 frequencies are
    the default ones divided by the same factors."""
    import gguf
    import numpy as np

    from llmkit.hf.gguf_export import llama3_rope_factors
    from llmkit.hf.mapping import from_hf_config

    config = transformers.LlamaConfig(**SHAPE, rope_parameters=LLAMA3_ROPE)
    init = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["llama3"]
    scaled, _ = init(config, "cpu")
    plain = 1.0 / (500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    factors = llama3_rope_factors(from_hf_config(config.to_dict()))
    assert np.allclose(factors, (plain / scaled).numpy(), rtol=1e-5) and factors.max() == 8.0
    assert gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] == "rope_freqs"


# -- llmkit's own model and its sentencepiece tokenizer --------------------------------------------


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    cfg = TokenizerConfig(vocab_size=500)
    model, _ = train_sentencepiece(sentencepiece_corpus(), cfg, log=lambda *a: None)
    (directory / MODEL_FILE).write_bytes(model)
    (directory / CONFIG_FILE).write_text(json.dumps(tokenizer_config_json(cfg, model)))
    return Tokenizer(directory)


@pytest.fixture(scope="module")
def own(sentencepiece, tmp_path_factory):
    ws = tmp_path_factory.mktemp("own")
    model = tiny_model(sentencepiece.vocab_size, seed=1, max_seq_len=256).eval()
    write_checkpoint_run(ws, "pretrain", model, sentencepiece)
    invoke("export", "--from", "pretrain", "--format", "gguf", "-w", ws)
    out = ws / "export" / "gguf-f16"
    invoke("import", "--from", out / "model-f16.gguf", "--out", "back", "-w", ws)
    return dict(ws=ws, out=out, model=model, gguf=out / "model-f16.gguf")


def test_an_llmkit_model_reads_back_with_the_same_logits(own, sentencepiece):
    x = ids(vocab=sentencepiece.vocab_size)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(own["out"], gguf_file=own["gguf"].name,
                                                               dtype=torch.float32).eval()
    back, _ = llmkit.load(own["ws"] / "back")
    with torch.no_grad():
        expected = own["model"](x)
        assert (theirs(x).logits - expected).abs().max().item() <= 1e-3
        assert (back(x) - expected).abs().max().item() <= 1e-3
    record = json.loads((own["out"] / "llmkit_export.json").read_text())
    assert record["architecture"] == "llama" and record["max_abs_logit_diff"] <= 1e-4
    assert record["greedy_tokens_equal"] and record["tokenizer_identical"]


def test_the_sentencepiece_tokenizer_reads_back_as_llama_with_scores_and_no_space_prefix(own, sentencepiece):
    meta = read_gguf_metadata(own["gguf"])
    assert meta["tokenizer.ggml.model"] == "llama" and meta["tokenizer.ggml.add_space_prefix"] is False
    assert meta["tokenizer.ggml.eot_token_id"] == sentencepiece.end_of_turn_id
    assert meta["tokenizer.ggml.bos_token_id"] == sentencepiece.bos_id
    _, fixed, fixes = load_gguf_with_transformers(own["gguf"])
    back = llmkit.load(own["ws"] / "back")[1]
    texts = MIXED + ["<|user|>hi<|end|><|assistant|>ok<|end|>"]
    for t in texts:
        assert back.encode(t) == fixed.encode(t, add_special_tokens=False) == sentencepiece.encode(t), t
    for t in MIXED:
        assert back.decode(sentencepiece.encode(t)) == sentencepiece.decode(sentencepiece.encode(t)) == t
    assert back.encode_chat(CHAT)[0] == sentencepiece.encode_chat(CHAT)[0]
    # transformers alone starts every sentencepiece text with "▁": what llmkit's reading puts right
    plain = transformers.AutoTokenizer.from_pretrained(own["out"], gguf_file=own["gguf"].name)
    assert "add_space_prefix" in fixes
    assert plain.convert_ids_to_tokens(plain.encode("abc", add_special_tokens=False))[0].startswith("\u2581")


def test_quantised_files_are_small_and_still_read_back(sentencepiece, tmp_path):
    ws = tmp_path / "ws"
    model = tiny_model(sentencepiece.vocab_size, hidden_size=256, n_heads=4, n_kv_heads=2, intermediate_size=640,
                       n_layers=3, max_seq_len=256).eval()
    run = write_checkpoint_run(ws, "pretrain", model, sentencepiece)
    fp32 = (run / "step-00000001" / "model.safetensors").stat().st_size
    sizes, diffs = {}, {}
    for quant in ("q8_0", "q4_0", "q4_1", "bf16"):
        invoke("export", "--from", "pretrain", "--format", "gguf", "--quant", quant, "--to", tmp_path / quant,
               "-w", ws)
        record = json.loads((tmp_path / quant / "llmkit_export.json").read_text())
        sizes[quant], diffs[quant] = record["bytes"], record["max_abs_logit_diff_unrounded"]
        assert record["max_abs_logit_diff"] <= 1e-4, quant  # the reader agrees with the rounded weights
    assert sizes["q8_0"] <= 0.28 * fp32, (sizes, fp32)
    assert sizes["q4_0"] < sizes["q8_0"] and sizes["q4_1"] < sizes["q8_0"]
    assert diffs["bf16"] < diffs["q4_0"] and diffs["q8_0"] < diffs["q4_0"]


def test_what_a_gguf_file_cannot_hold_exits_2_naming_it(sentencepiece, tmp_path):
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "moe", tiny_model(sentencepiece.vocab_size, n_experts=4, tie_embeddings=False),
                         sentencepiece)
    write_checkpoint_run(ws, "ln", tiny_model(sentencepiece.vocab_size, norm="layernorm"), sentencepiece)
    write_checkpoint_run(ws, "bias-qknorm", tiny_model(sentencepiece.vocab_size, attention_bias=True, qk_norm=True),
                         sentencepiece)
    cases = [(["--from", "moe", "--format", "gguf"], "convert_hf_to_gguf.py"),
             (["--from", "ln", "--format", "gguf"], "--set model.norm=rmsnorm"),
             (["--from", "bias-qknorm", "--format", "gguf"], "attention_bias or qk_norm, not both"),
             (["--from", "ln", "--format", "gguf", "--quant", "q4_k"], "f16, bf16, q8_0, q4_0, q4_1"),
             (["--from", "ln", "--format", "gguf", "--quant", "q4_k"], "llama-quantize"),
             (["--from", "ln", "--format", "onnx"], "'hf' or 'gguf'")]
    for args, named in cases:
        r = runner.invoke(build_app(), ["export", *args, "-w", str(ws)])
        assert r.exit_code == 2 and named in r.output, (args, r.output)
    assert not list(ws.glob("export/gguf*"))
