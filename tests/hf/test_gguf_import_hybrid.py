"""`llmkit import --from FILE.gguf` of the llama.cpp architectures transformers does not read, which
llmkit reads itself (llmkit.hf.gguf_layout_read): Qwen3.5's `qwen35` and `smollm3`. export -> import
gives the model back with its weights rounded as the file stores them (f16 exactly; q8_0 and a
K-quant mix as gguf-py's quantisers and llmkit's round each row), its logits, its tokenizer and chat
template; the config is the same read from llama.cpp's keys as from the `llmkit.hf_config` key; a
missing or misshaped tensor and an architecture nobody reads exit 2 naming them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from llmkit.hf.gguf_export import encode_mix_tensor
from llmkit.hf.gguf_qwen35 import tiled_value_heads
from llmkit.hf.gguf_read import LLMKIT_HF_CONFIG_KEY
from tests.hf.hybrid_fixtures import save_qwen35, save_smollm3

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = {"qwen35": save_qwen35, "smollm3": save_smollm3}
MIXED = ["Hello 世界, def f(x):\n    return x ** 2  # 平方\n", "  héllo ñ 12345 <|im_end|> 中文和English混合",
         "\t\tif (a != b) { printf(\"%d\\n\", a); } // 注释"]
CHAT = [{"role": "user", "content": "你好, write def f(x)"}, {"role": "assistant", "content": "return x * 2"}]


def invoke(*args, code=0):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r.output


@pytest.fixture(scope="module", params=list(FAMILIES))
def exported(request, tmp_path_factory):
    """(workspace, {"f16": its f16 GGUF file}) of a tiny model of the family, imported as `run`."""
    root = tmp_path_factory.mktemp(request.param)
    ws = root / "ws"
    invoke("import", "--from", FAMILIES[request.param](root / "hf"), "--out", "run", "-w", ws)
    invoke("export", "--from", "run", "--format", "gguf", "--to", root / "f16", "-w", ws)
    return ws, {"f16": root / "f16" / "model-f16.gguf"}


def weights(ws: Path, run: str) -> dict:
    model, _ = llmkit.load(ws / run)
    return {k: v.float() for k, v in model.state_dict().items()}


def is_matrix(name: str, tensor) -> bool:
    """What export stores in f16 / quantised: every tensor of 2 axes or more but Qwen3.5's convolution."""
    return tensor.dim() >= 2 and "conv1d" not in name


def logits_of(ws: Path, run: str, state_dict: dict | None = None):
    model, _ = llmkit.load(ws / run)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    with torch.no_grad():
        return model(torch.arange(48)[None] * 13 % 800)


def test_an_f16_file_imports_to_the_model_with_its_matrices_rounded_to_f16(exported):
    ws, files = exported
    invoke("import", "--from", files["f16"], "--out", "back", "-w", ws)
    original, back = weights(ws, "run"), weights(ws, "back")
    assert set(back) == set(original)
    rounded = {k: v.half().float() if is_matrix(k, v) else v for k, v in original.items()}
    for name, tensor in original.items():
        if is_matrix(name, tensor) or "conv1d" in name or "norm" not in name and "A_log" not in name:
            assert torch.equal(back[name], rounded[name]), name  # f16 matrices, f32 vectors stored as they are
        else:  # qwen35 stores zero-centred norms as 1 + w and A_log as -exp(A_log), in float32
            assert torch.allclose(back[name], tensor, rtol=1e-6, atol=1.2e-7), name
    assert (logits_of(ws, "back") - logits_of(ws, "run", rounded)).abs().max() < 1e-5


def test_the_tokenizer_and_chat_template_come_back(exported):
    import transformers

    ws, files = exported
    invoke("import", "--from", files["f16"], "--out", "back-tok", "-w", ws)
    original, back = (transformers.AutoTokenizer.from_pretrained(ws / run / "step-00000000" / "tokenizer")
                      for run in ("run", "back-tok"))
    assert back.get_vocab() == original.get_vocab()  # the [PAD<id>] tokens padding the file's vocabulary left out
    for text in MIXED:
        assert back.encode(text) == original.encode(text), text
        assert back.decode(back.encode(text)) == text
    assert back.eos_token == original.eos_token
    assert (back.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
            == original.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True))


def rounded_as(array: np.ndarray, qtype) -> np.ndarray:
    """`array` rounded as gguf-py's quantiser (which export uses) stores it in `qtype`."""
    return gguf.quants.dequantize(gguf.quants.quantize(array, qtype), qtype).reshape(array.shape)


@pytest.mark.parametrize("quant", ["bf16", "q8_0", "q4_0", "q4_1"])
def test_a_quantised_file_imports_to_the_model_with_each_row_rounded_as_the_file_rounds_it(exported, quant):
    ws, files = exported
    to = files["f16"].parent.parent / quant
    invoke("export", "--from", "run", "--format", "gguf", "--quant", quant, "--to", to, "-w", ws)
    reader = gguf.GGUFReader(str(to / f"model-{quant}.gguf"))
    types = {t.name: t.tensor_type for t in reader.tensors}
    invoke("import", "--from", to / f"model-{quant}.gguf", "--out", f"back-{quant}", "-w", ws)
    original, back = weights(ws, "run"), weights(ws, f"back-{quant}")
    cfg = llmkit.load(ws / "run")[0].config
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, reader.fields["general.architecture"].contents().upper()),
                                     cfg.n_layers)
    for name, tensor in original.items():
        if not is_matrix(name, tensor) or cfg.tie_embeddings and name == "lm_head.weight":
            continue
        qtype, array = types[names.get_name(name, try_suffixes=(".weight",))], tensor.numpy()
        # blocks run along a row, and export reorders only rows (value heads, rotary pairs) but in out_proj
        if name.endswith("linear_attn.out_proj.weight"):
            expected = tiled_value_heads(name, rounded_as(tiled_value_heads(name, array, cfg), qtype), cfg, untile=True)
        else:
            expected = rounded_as(array, qtype)
        assert np.array_equal(back[name].numpy(), expected), (name, qtype.name)
    assert set(types.values()) >= {gguf.GGMLQuantizationType[quant.upper()]}


def rewritten(src: Path, dst: Path, drop_keys=(), drop_tensors=(), keys: dict | None = None,
              tensors: dict | None = None) -> Path:
    """`src` rewritten with gguf-py, less `drop_keys` and `drop_tensors`; `keys` ({key: (value, type)})
    and `tensors` ({name: array}) set or added."""
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    keys, tensors = keys or {}, tensors or {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys or key in keys:
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    for key, (value, vtype) in keys.items():
        writer.add_key_value(key, value, vtype)
    for t in reader.tensors:
        if t.name not in drop_tensors and t.name not in tensors:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_the_config_read_from_llama_cpps_keys_equals_the_one_llmkit_wrote(exported, tmp_path):
    ws, files = exported
    plain = rewritten(files["f16"], tmp_path / "plain.gguf", drop_keys=(LLMKIT_HF_CONFIG_KEY,))
    assert LLMKIT_HF_CONFIG_KEY not in gguf.GGUFReader(str(plain)).fields
    invoke("import", "--from", files["f16"], "--out", "keyed", "-w", ws)
    invoke("import", "--from", plain, "--out", "plain", "-w", ws)
    configs = [json.loads((ws / run / "step-00000000" / "config.json").read_text()) for run in ("run", "keyed", "plain")]
    assert configs[0] == configs[1] == configs[2]
    keyed, read_plain = weights(ws, "keyed"), weights(ws, "plain")
    assert all(torch.equal(keyed[k], read_plain[k]) for k in keyed)


def test_a_multi_token_prediction_block_is_left_out_with_a_note(exported, tmp_path):
    """llama.cpp's converter writes Qwen3.5's MTP block as one more layer (block_count) and says so
    (nextn_predict_layers); llmkit's model has no place for it."""
    ws, files = exported
    arch = gguf.GGUFReader(str(files["f16"])).fields["general.architecture"].contents()
    u32 = gguf.GGUFValueType.UINT32
    mtp = rewritten(files["f16"], tmp_path / "mtp.gguf", drop_keys=(LLMKIT_HF_CONFIG_KEY,),
                    keys={f"{arch}.block_count": (5, u32), f"{arch}.nextn_predict_layers": (1, u32)},
                    tensors={"blk.4.nextn.eh_proj.weight": np.ones((64, 128), np.float16)})
    output = invoke("import", "--from", mtp, "--out", "mtp", "-w", ws)
    assert f"note: {mtp}: 1 tensors llmkit's model has no place for left out (blk.4.nextn.eh_proj.weight)" in output
    configs = [json.loads((ws / run / "step-00000000" / "config.json").read_text()) for run in ("run", "mtp")]
    assert configs[0] == configs[1]


def test_a_missing_or_misshaped_tensor_or_key_exits_2_naming_it_and_leaves_nothing(exported, tmp_path):
    ws, files = exported
    name = "blk.1.ffn_up.weight"
    missing = rewritten(files["f16"], tmp_path / "missing.gguf", drop_tensors=(name,))
    refused = invoke("import", "--from", missing, "--out", "no", "-w", ws, code=2)
    assert f"{missing} has no tensor {name} (model.layers.1.mlp.up_proj.weight" in refused
    assert not (ws / "no").exists()
    short = rewritten(files["f16"], tmp_path / "short.gguf", tensors={name: np.zeros((64, 96), np.float16)})
    refused = invoke("import", "--from", short, "--out", "no", "-w", ws, code=2)
    assert f"{short}: tensor {name} is [64, 96] where the file's keys give [128, 64]" in refused
    assert not (ws / "no").exists()
    arch = gguf.GGUFReader(str(files["f16"])).fields["general.architecture"].contents()
    keyless = rewritten(files["f16"], tmp_path / "keyless.gguf", drop_keys=(LLMKIT_HF_CONFIG_KEY, f"{arch}.block_count"))
    refused = invoke("import", "--from", keyless, "--out", "no", "-w", ws, code=2)
    assert f"{keyless} lacks the key {arch}.block_count" in refused and not (ws / "no").exists()


def test_an_architecture_neither_llmkit_nor_transformers_reads_exits_2_naming_it(tmp_path):
    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "rwkv7")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.ones((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    refused = invoke("import", "--from", path, "--out", "no", "-w", tmp_path / "ws", code=2)
    assert "llama.cpp architecture 'rwkv7' is read neither by llmkit (qwen35, smollm3)" in refused
    assert "qwen3" in refused and "llama" in refused
    assert not (tmp_path / "ws" / "no").exists()


def test_a_k_quant_file_imports_to_the_model_with_each_row_rounded_as_the_mix_rounds_it(tmp_path):
    """q4_k_m on a Qwen3.5 whose rows are 256 wide (K blocks) and 64 or 288 (fallbacks), tied."""
    ws = tmp_path / "ws"
    invoke("import", "--from", save_qwen35(tmp_path / "hf", hidden_size=256, intermediate_size=288,
                                           tie_word_embeddings=True), "--out", "run", "-w", ws)
    invoke("export", "--from", "run", "--format", "gguf", "--quant", "q4_k_m", "--to", tmp_path / "q", "-w", ws)
    reader = gguf.GGUFReader(str(tmp_path / "q" / "model-q4_k_m.gguf"))
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert {"Q4_K", "Q6_K", "Q5_0"} <= {t.name for t in types.values()}
    invoke("import", "--from", tmp_path / "q" / "model-q4_k_m.gguf", "--out", "back", "-w", ws)
    original, back = weights(ws, "run"), weights(ws, "back")
    model = llmkit.load(ws / "run")[0]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN35, model.config.n_layers)
    for name, tensor in original.items():
        if not is_matrix(name, tensor) or name == "lm_head.weight":  # tied: the embedding
            continue
        qtype = types[names.get_name(name, try_suffixes=(".weight",))]
        tiled = name.endswith("linear_attn.out_proj.weight")
        array = tiled_value_heads(name, tensor.numpy(), model.config) if tiled else tensor.numpy()
        data, _ = encode_mix_tensor(array, qtype.name, None, threads=1)
        expected = gguf.quants.dequantize(data, qtype).reshape(array.shape)
        expected = tiled_value_heads(name, expected, model.config, untile=True) if tiled else expected
        assert np.array_equal(back[name].numpy(), expected), (name, qtype.name)
    assert torch.equal(back["lm_head.weight"], back["model.embed_tokens.weight"])
