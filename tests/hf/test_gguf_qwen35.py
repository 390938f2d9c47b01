"""`llmkit export --format gguf` of a Qwen3.5 language model: llama.cpp's `qwen35` layout as its
convert_hf_to_gguf.py writes it (llmkit.hf.gguf_qwen35), read back with gguf-py: the Gated DeltaNet
keys, tensor names llama.cpp's qwen35 loader knows, A_log as -exp(A_log), zero-centred norms as
1 + weight (not the gated norm), the convolution as [channels, kernel] in F32, value heads tiled;
Qwen3.5's pre-tokenizer named `qwen35`; and a shape llama.cpp cannot run refused by name (exit 2).
llama.cpp itself runs the file in tests/hf/test_gguf_export_llama_cpp.py."""

from __future__ import annotations

import re

import numpy as np
import pytest
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from tests.hf.hybrid_fixtures import QWEN35_SHAPE, save_qwen35

pytestmark = pytest.mark.usefixtures("one_thread")


def invoke(*args, code=0):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r.output


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(the imported llmkit model's tensors, the f16 file's fields, its tensors by name, export's output)."""
    import gguf

    root = tmp_path_factory.mktemp("qwen35")
    ws = root / "ws"
    invoke("import", "--from", save_qwen35(root / "hf"), "--out", "run", "-w", ws)
    output = invoke("export", "--from", "run", "--format", "gguf", "--to", root / "gguf", "-w", ws)
    reader = gguf.GGUFReader(str(root / "gguf" / "model-f16.gguf"))
    fields = {k: f.contents() for k, f in reader.fields.items()}
    model, _ = llmkit.load(ws / "run")
    weights = {k: v.float().numpy() for k, v in model.state_dict().items()}
    return weights, fields, {t.name: t for t in reader.tensors}, output


def stored(tensor) -> np.ndarray:
    """A tensor as the file holds it, in PyTorch's axis order (GGUF lists them reversed)."""
    return np.asarray(tensor.data, dtype=np.float32).reshape(tuple(reversed(tensor.shape.tolist())))


def test_the_keys_are_llama_cpps_qwen35_keys(exported):
    _, fields, _, output = exported
    assert fields["general.architecture"] == "qwen35" and fields["qwen35.block_count"] == 4
    assert fields["qwen35.attention.recurrent_layers"] == [True, True, True, False]
    assert (fields["qwen35.ssm.conv_kernel"], fields["qwen35.ssm.state_size"], fields["qwen35.ssm.group_count"],
            fields["qwen35.ssm.time_step_rank"], fields["qwen35.ssm.inner_size"]) == (4, 16, 2, 4, 64)
    assert fields["qwen35.rope.dimension_count"] == 4  # a quarter of a 16-wide head rotates
    assert fields["qwen35.rope.dimension_sections"] == [1, 1, 1, 0]  # 11, 11, 10 outnumber 16 dimensions
    assert fields["tokenizer.ggml.pre"] == "qwen35"
    assert "transformers cannot read qwen35" in output


def test_the_tensors_are_named_and_shaped_as_llama_cpp_loads_them(exported):
    import gguf

    _, _, tensors, _ = exported
    allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN35]}
    assert {re.sub(r"^blk\.\d+\.", "blk.{bid}.", n).removesuffix(".weight").removesuffix(".bias")
            for n in tensors} <= allowed
    assert "blk.0.ssm_a" in tensors and "blk.0.ssm_dt.bias" in tensors and "blk.3.attn_gate.weight" not in tensors
    conv = tensors["blk.0.ssm_conv1d.weight"]
    assert conv.tensor_type == gguf.GGMLQuantizationType.F32 and stored(conv).shape == (128, 4)
    assert stored(tensors["blk.3.attn_q.weight"]).shape == (2 * 4 * 16, 64)  # per head: query, gate


def test_decay_norms_and_value_heads_are_written_as_the_converter_writes_them(exported):
    weights, _, tensors, _ = exported
    layer = "model.layers.0.linear_attn."
    n_k, n_v, dim = QWEN35_SHAPE["linear_num_key_heads"], QWEN35_SHAPE["linear_num_value_heads"], 16
    per_k = n_v // n_k
    # value head h of key head g sits at g * per_k + h in transformers, at h * n_k + g in llama.cpp
    tiled = [g * per_k + h for h in range(per_k) for g in range(n_k)]
    assert np.allclose(stored(tensors["blk.0.ssm_a"]), -np.exp(weights[layer + "A_log"][tiled]), rtol=1e-6)
    assert np.allclose(stored(tensors["blk.0.ssm_dt.bias"]), weights[layer + "dt_bias"][tiled])
    z = weights[layer + "in_proj_z.weight"].reshape(n_v, dim, -1)[tiled].reshape(n_v * dim, -1)
    assert np.abs(stored(tensors["blk.0.attn_gate.weight"]) - z).max() < 1e-3
    out = weights[layer + "out_proj.weight"].reshape(-1, n_v, dim)[:, tiled].reshape(-1, n_v * dim)
    assert np.abs(stored(tensors["blk.0.ssm_out.weight"]) - out).max() < 1e-3
    qkv, key_dim = weights[layer + "in_proj_qkv.weight"], n_k * dim
    v = qkv[2 * key_dim:].reshape(n_v, dim, -1)[tiled].reshape(n_v * dim, -1)
    assert np.abs(stored(tensors["blk.0.attn_qkv.weight"]) - np.concatenate([qkv[:2 * key_dim], v])).max() < 1e-3
    conv = weights[layer + "conv1d.weight"][:, 0]
    conv_v = conv[2 * key_dim:].reshape(n_v, dim, -1)[tiled].reshape(n_v * dim, -1)
    assert np.allclose(stored(tensors["blk.0.ssm_conv1d.weight"]), np.concatenate([conv[:2 * key_dim], conv_v]))
    # zero-centred RMSNorms scale by 1 + weight; the gated norm by its weight
    assert np.allclose(stored(tensors["blk.0.attn_norm.weight"]), 1 + weights["model.layers.0.input_layernorm.weight"])
    assert np.allclose(stored(tensors["blk.3.attn_q_norm.weight"]),
                       1 + weights["model.layers.3.self_attn.q_norm.weight"])
    assert np.allclose(stored(tensors["output_norm.weight"]), 1 + weights["model.norm.weight"])
    assert np.allclose(stored(tensors["blk.0.ssm_norm.weight"]), weights[layer + "norm.weight"])


def test_value_heads_wider_than_key_heads_are_refused_by_name(tmp_path):
    ws = tmp_path / "ws"
    invoke("import", "--from", save_qwen35(tmp_path / "hf", linear_value_head_dim=8), "--out", "run", "-w", ws)
    refused = invoke("export", "--from", "run", "--format", "gguf", "--to", tmp_path / "no", "-w", ws, code=2)
    assert "key heads are 16 wide and its value heads 8" in refused and "ssm.state_size" in refused
    assert not (tmp_path / "no").exists()


def test_qwen35s_pre_tokenizer_is_named_qwen35():
    from llmkit.hf.gguf_tokenizer import QWEN2_SPLIT, QWEN35_SPLIT, pre_tokenizer_name

    def spec(regex):
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}

    assert pre_tokenizer_name(spec(QWEN35_SPLIT), "t") == "qwen35"
    assert pre_tokenizer_name(spec(QWEN2_SPLIT), "t") == "qwen2"
