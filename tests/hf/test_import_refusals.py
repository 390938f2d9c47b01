"""`llmkit import` of a hybrid model it cannot build (`llmkit.hf.import_`, `llmkit.hf.mapping`): a Qwen3.5
folder saved by transformers, then broken the way a hand-edited or half-copied folder is (a layer type
llmkit does not know, head sizes that disagree with each other or with the weights, a linear-attention
tensor missing, a fused Qwen3-Next projection of the wrong size) exits 2 with one line naming the key,
no traceback, and leaves nothing in the workspace."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from tests.model.test_mixture_of_experts import invoke, save
from tests.hf.test_qwen3_5 import PATTERNS, save_qwen35

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A good Qwen3.5 folder (three linear layers, one full), copied by each test before it breaks it."""
    path = tmp_path_factory.mktemp("qwen35") / "hf"
    save_qwen35(path, PATTERNS["three-linear-one-full"])
    return path


def broken(folder, tmp_path, config=None, drop=(), reshape=None):
    """A copy of `folder` with config.json keys changed, tensors dropped or one tensor cut short."""
    copy = tmp_path / "broken"
    shutil.copytree(folder, copy)
    if config:
        hf = json.loads((copy / "config.json").read_text())
        for key, value in config.items():
            hf[key] = value(hf[key]) if callable(value) else value
        (copy / "config.json").write_text(json.dumps(hf))
    if drop or reshape:
        weights = load_file(copy / "model.safetensors")
        for key in drop:
            del weights[key]
        if reshape:
            weights[reshape] = weights[reshape][:-1].clone()
        save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
    return copy


def refused(source, tmp_path) -> str:
    ws = tmp_path / "ws"
    output = invoke("import", "--from", source, "-w", ws, code=2)
    assert "Traceback" not in output and output.startswith("error:")
    assert not ws.exists() or not any(ws.rglob("*")), sorted(ws.rglob("*"))  # nothing left behind
    return output


def test_an_unknown_layer_type_is_named_with_its_layer(folder, tmp_path):
    config = {"layer_types": lambda types: [types[0], "sliding_attention", *types[2:]]}
    output = refused(broken(folder, tmp_path, config=config), tmp_path)
    assert "layer_types[1]='sliding_attention'" in output and "linear_attention" in output


def test_a_layer_type_list_of_the_wrong_length_is_named(folder, tmp_path):
    output = refused(broken(folder, tmp_path, config={"layer_types": lambda types: types[:3]}), tmp_path)
    assert "layer_types has 3 entries" in output and "num_hidden_layers=4" in output


def test_value_heads_that_do_not_group_under_the_key_heads_are_named(folder, tmp_path):
    output = refused(broken(folder, tmp_path, config={"linear_num_value_heads": 3}), tmp_path)
    assert "linear_num_value_heads (3)" in output and "linear_num_key_heads (2)" in output


@pytest.mark.parametrize("key, tensor", [
    ("head_dim", "model.layers.3.self_attn.q_proj.weight"),  # the full-attention layer's heads
    ("linear_key_head_dim", "model.layers.0.linear_attn.in_proj_qkv.weight"),  # the Gated DeltaNet's
])
def test_head_dims_that_disagree_with_the_weights_name_the_tensor_and_both_shapes(folder, tmp_path, key, tensor):
    output = refused(broken(folder, tmp_path, config={key: 8}), tmp_path)
    assert tensor in output and "where config.json gives" in output


def test_a_missing_linear_attention_tensor_is_named(folder, tmp_path):
    output = refused(broken(folder, tmp_path, drop=["model.layers.1.linear_attn.A_log"]), tmp_path)
    assert "model.layers.1.linear_attn.A_log" in output and "missing" in output


def test_a_qwen3_next_fused_projection_of_the_wrong_size_is_named(tmp_path):
    """The split of Qwen3-Next's in_proj_qkvz into Qwen3.5's projections needs its exact row count: a
    cut tensor is named as it is on disk, not split into wrong pieces."""
    save(tmp_path / "next", "qwen3_next")
    source = broken(tmp_path / "next", tmp_path, reshape="model.layers.0.linear_attn.in_proj_qkvz.weight")
    output = refused(source, tmp_path)
    assert "model.layers.0.linear_attn.in_proj_qkvz.weight" in output and "unexpected" in output
