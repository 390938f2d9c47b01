"""The importance matrix llmkit's own model computes (`llmkit export --format gguf --quant q4_k_m
--set imatrix.data=DATASET`): its sums and counts equal a direct computation with forward hooks on
the transformers model of the same weights; the file is llama.cpp's imatrix GGUF (read by the gguf
package, with llama-quantize's metadata keys); the K-quant written with it is byte-identical to
llama.cpp's quantiser given the same file's weights (skipped where llama-cpp-python is absent);
bad settings exit 2 naming them."""

from __future__ import annotations

import ctypes
import json
import re

import gguf
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.hf.gguf_quant_mix import MIXES, read_imatrix
from llmkit.hf.imatrix_compute import ImatrixConfig, calibration_chunks, compute_imatrix
from tests.train.posttrain_fixtures import (make_tokenizer, task_sentences, tiny_model, write_checkpoint_run,
                                            write_dataset)

pytestmark = pytest.mark.usefixtures("one_thread")
SHAPE = dict(hidden_size=256, intermediate_size=256, n_layers=2, n_heads=4, n_kv_heads=1, tie_embeddings=False,
             max_seq_len=64, init_std=0.05)


def invoke(*args, code=0):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    ws = tmp_path_factory.mktemp("imatrix") / "ws"
    tok = make_tokenizer(ws.parent / "tok")
    model = tiny_model(tok.vocab_size, seed=3, **SHAPE)
    write_checkpoint_run(ws, "run", model, tok)
    write_dataset(ws, "corpus", [{"prompt": s} for s in task_sentences(60)])
    return ws, model, tok


def transformers_sums(model, chunks) -> dict:
    """The definition computed apart: pre-hooks on the transformers model's linear layers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmkit.hf.mapping import to_hf_config, to_hf_state_dict

    config = {k: v for k, v in to_hf_config(model.config).items() if k not in ("architectures", "model_type")}
    hf = LlamaForCausalLM(LlamaConfig(**config)).eval()
    hf.load_state_dict(to_hf_state_dict(model), strict=False)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, model.config.n_layers)
    sums = {}

    def hook(name):
        def collect(module, inputs):
            x = inputs[0].reshape(-1, module.in_features).double()
            total, count = sums.get(name, (0, 0))
            sums[name] = (total + (x * x).sum(0).numpy(), count + x.shape[0])
        return collect

    for module_name, module in hf.named_modules():
        if isinstance(module, torch.nn.Linear) and re.match(r"model\.layers\.", module_name):
            module.register_forward_pre_hook(hook(names.get_name(module_name + ".weight", try_suffixes=(".weight",))))
    with torch.no_grad():
        hf(chunks)
    return sums


def test_the_sums_are_those_of_forward_hooks_on_the_transformers_model(ws):
    _, model, tok = ws
    chunks = torch.randint(3, tok.vocab_size, (3, 32), generator=torch.Generator().manual_seed(0))
    ours = compute_imatrix(model.eval(), chunks, "llama", batch=2)
    theirs = transformers_sums(model, chunks)
    assert sorted(ours) == sorted(theirs) and len(ours) == 7 * 2  # q k v output gate up down, 2 layers
    for name, (sums, counts) in ours.items():
        assert sums.shape == (1, theirs[name][0].size) and counts.tolist() == [96] == [theirs[name][1]]
        np.testing.assert_allclose(sums[0], theirs[name][0], rtol=1e-5, err_msg=name)


def test_calibration_reads_the_datasets_text_in_chunks(ws):
    root, _, tok = ws
    chunks = calibration_chunks(tok, root / "corpus", ImatrixConfig(data="corpus", tokens=200, chunk=64))
    assert tuple(chunks.shape) == (3, 64)  # 200 tokens at most: three whole chunks


def llama_cpp_quantize(f16, out, mix: str, weights: dict) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding is not installed")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_" + MIXES[mix][0])
    params.nthread = 1
    entries = (llama_cpp.llama_model_imatrix_data * (len(weights) + 1))()  # a NULL-named entry ends it
    for entry, (name, values) in zip(entries, weights.items()):
        entry.name, entry.size = name.encode(), values.size
        entry.data = values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    params.imatrix = entries
    assert llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(), ctypes.byref(params)) == 0


def test_export_writes_llama_cpps_imatrix_and_quantises_with_it_as_llama_cpp_does(ws, tmp_path):
    root, _, _ = ws
    invoke("export", "--from", "run", "--format", "gguf", "--quant", "q4_k_m", "--to", tmp_path / "q4", "-w", root,
           "--set", "probe=false", "--set", "imatrix.data=corpus", "--set", "imatrix.chunk=32",
           "--set", "imatrix.tokens=256")
    path = tmp_path / "q4" / "imatrix.gguf"
    reader = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert fields == {"general.type": "imatrix", "imatrix.datasets": [str(root / "corpus")],
                      "imatrix.chunk_count": 8, "imatrix.chunk_size": 32}
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert len(tensors) == 2 * 14 and tensors["blk.1.ffn_down.weight.counts"].tolist() == [[256.0]]
    assert tensors["blk.0.attn_q.weight.in_sum2"].shape == (1, 256)
    manifest = json.loads((tmp_path / "q4" / "manifest.json").read_text())
    assert manifest["stats"]["imatrix"]["tokens"] == 256 and manifest["inputs"][-1]["path"].endswith("corpus")
    assert json.loads((tmp_path / "q4" / "llmkit_export.json").read_text())["imatrix"] == "imatrix.gguf"

    invoke("export", "--from", "run", "--format", "gguf", "--quant", "f16", "--to", tmp_path / "f16", "-w", root,
           "--set", "probe=false")
    llama_cpp_quantize(tmp_path / "f16" / "model-f16.gguf", tmp_path / "llama.gguf", "q4_k_m", read_imatrix(path))
    theirs = {t.name: bytes(np.asarray(t.data).tobytes()) for t in gguf.GGUFReader(tmp_path / "llama.gguf").tensors}
    ours = {t.name: bytes(np.asarray(t.data).tobytes())
            for t in gguf.GGUFReader(tmp_path / "q4" / "model-q4_k_m.gguf").tensors}
    assert sorted(ours) == sorted(theirs) and [n for n in ours if ours[n] != theirs[n]] == []


def test_bad_imatrix_settings_exit_2_naming_them(ws, tmp_path):
    root, _, _ = ws
    base = ("export", "--from", "run", "--format", "gguf", "--quant", "q4_k_m", "-w", root, "--set", "probe=false")
    r = invoke(*base, "--to", tmp_path / "a", "--set", "imatrix.data=nowhere", code=2)
    assert "nowhere" in r.output and "imatrix.data" in r.output
    r = invoke(*base, "--to", tmp_path / "b", "--set", "imatrix.data=auto", code=2)  # no filtered/dedup/clean/raw
    assert "imatrix.data=auto" in r.output and "clean" in r.output
    r = invoke(*base, "--to", tmp_path / "c", "--set", "imatrix.data=corpus", "--set", "imatrix.chunk=8", code=2)
    assert "imatrix.chunk" in r.output
    r = invoke(*base, "--to", tmp_path / "d", "--set", "imatrix.data=corpus", "--set", "imatrix.file=x.dat", code=2)
    assert "imatrix.file" in r.output
    r = invoke(*base, "--to", tmp_path / "e", "--set", "imatrix.data=corpus", "--set", "imatrix.tokens=100000",
               "--set", "imatrix.chunk=4096", code=2)
    assert "fewer than one chunk" in r.output
