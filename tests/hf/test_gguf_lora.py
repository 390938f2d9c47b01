"""`llmkit export --format gguf --set adapter_only=true`: a LoRA run of a tiny llama-family model as a
llama.cpp adapter file, loaded by llama-cpp-python over the base's f16 GGUF (`lora_path`): its logits
are llmkit's merged model's (to f16's rounding, far below what the adapters change) and its greedy
tokens the same. The file's keys and tensors are convert_lora_to_gguf.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from llmkit.checkpoints import step_folders as ckpt
from tests.train.posttrain_fixtures import (addition_rows, make_tokenizer, tiny_model, write_checkpoint_run,
                                            write_dataset)

pytestmark = pytest.mark.usefixtures("one_thread")
NEW_TOKENS = 12


def invoke(*args, code=0):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A workspace with `base` and `sft` (rank-4 LoRA, alpha 8, rsLoRA, on every linear layer) whose
    lora_B are then set to random values the size of the base's weights: the adapters change every
    output, so a wrongly laid out or wrongly scaled file shows."""
    from safetensors.torch import load_file, save_file

    ws = tmp_path_factory.mktemp("lora") / "ws"
    tok = make_tokenizer(ws.parent / "tok")
    write_checkpoint_run(ws, "base", tiny_model(tok.vocab_size, seed=3, hidden_size=64, intermediate_size=128,
                                                init_std=0.3), tok)
    write_dataset(ws, "sft_train", addition_rows(8))
    invoke("sft", "--from", "base", "-w", ws, "--set", "lora.r=4", "--set", "lora.alpha=8", "--set", "lora.use_rslora=true",
           "--set", "max_steps=1", "--set", "warmup_steps=0", "--set", "micro_batch_size=2", "--set", "eval_every=0",
           "--set", "seq_len=64")
    weights = ckpt.resolve_step_dir(ws / "sft") / "adapter_model.safetensors"
    g = torch.Generator().manual_seed(0)
    tensors = {k: (torch.randn(v.shape, generator=g) * 0.3 if ".lora_B." in k else v)
               for k, v in load_file(str(weights)).items()}
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return ws, tok


def test_the_adapter_file_is_convert_lora_to_ggufs_layout(lora_run):
    import gguf

    ws, _ = lora_run
    invoke("export", "--from", "sft", "--format", "gguf", "-w", ws, "--set", "adapter_only=true")
    path = ws / "export" / "gguf-adapter-f16" / "adapter-f16.gguf"
    reader = gguf.GGUFReader(str(path))
    keys = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert keys["general.type"] == "adapter" and keys["adapter.type"] == "lora"
    assert keys["general.architecture"] == "llama"
    assert keys["adapter.lora.alpha"] == pytest.approx(8 * 2)  # rsLoRA: alpha * sqrt(r), llama.cpp divides by r
    tensors = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    # ggml's shapes, innermost first: lora_a [in, r], lora_b [r, out]
    assert tensors["blk.0.attn_q.weight.lora_a"] == (64, 4) and tensors["blk.0.attn_q.weight.lora_b"] == (4, 64)
    assert tensors["blk.1.ffn_down.weight.lora_a"] == (128, 4) and tensors["blk.1.ffn_down.weight.lora_b"] == (4, 64)
    assert len(tensors) == 2 * 7 * 2  # q k v o gate up down, two layers
    record = json.loads((path.parent / "llmkit_export.json").read_text())
    assert record["rank"] == 4 and (Path(record["base"]) / "model.safetensors").is_file()  # the run's pinned base


def test_llama_cpp_with_the_adapter_decodes_as_llmkits_merged_model(lora_run):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding is not installed")
    import numpy as np

    from llmkit.eval.efficiency import greedy_llama_cpp
    from llmkit.model.decoding import generate

    ws, tok = lora_run
    invoke("export", "--from", "sft", "--format", "gguf", "-w", ws, "--set", "adapter_only=true")
    base_run = json.loads((ws / "export" / "gguf-adapter-f16" / "llmkit_export.json").read_text())["base"]
    invoke("export", "--from", base_run, "--format", "gguf", "--to", ws.parent / "base-gguf", "-w", ws,
           "--set", "probe=false")
    merged, _ = llmkit.load(ws / "sft")
    base, _ = llmkit.load(ws / "base")
    prompts = [tok.document_start_ids() + tok.encode(f"What is {a}+{a + 7}?") for a in (11, 23, 35, 47)]

    def llama(**kwargs):
        return llama_cpp.Llama(model_path=str(ws.parent / "base-gguf" / "model-f16.gguf"), n_ctx=128, n_threads=1,
                               n_threads_batch=1, verbose=False, **kwargs)

    adapted, plain = llama(lora_path=str(ws / "export" / "gguf-adapter-f16" / "adapter-f16.gguf")), llama()
    try:
        diffs, changes, equal = [], [], 0
        for p in prompts:
            with torch.no_grad():
                ours = merged(torch.tensor([p]))[0, -1].numpy()
                before = base(torch.tensor([p]))[0, -1].numpy()
                reply = generate(merged, torch.tensor([p]), NEW_TOKENS, greedy=True)[0, len(p):].tolist()
            adapted.reset()
            adapted.eval(p)
            theirs = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(adapted.ctx, -1), shape=(adapted.n_vocab(),))
            diffs.append(float(np.abs(theirs - ours).max()))
            changes.append(float(np.abs(before - ours).max()))
            equal += greedy_llama_cpp(adapted, p, NEW_TOKENS) == reply
        assert greedy_llama_cpp(plain, prompts[0], NEW_TOKENS) != greedy_llama_cpp(adapted, prompts[0], NEW_TOKENS)
    finally:
        adapted.close()
        plain.close()
    assert max(diffs) < 0.02 * min(changes), (diffs, changes)
    assert equal >= len(prompts) - 1, equal


def test_what_llama_cpps_adapters_cannot_hold_is_refused(lora_run):
    ws, _ = lora_run
    r = invoke("export", "--from", "base", "--format", "gguf", "-w", ws, "--set", "adapter_only=true", code=2)
    assert "holds no LoRA adapters" in r.output
    r = invoke("export", "--from", "sft", "--format", "gguf", "--quant", "q8_0", "-w", ws, "--set", "adapter_only=true",
               code=2)
    assert "f16 or bf16" in r.output
    r = invoke("export", "--from", "sft", "-w", ws, "--set", "adapter_only=true", code=2)
    assert "needs --format gguf" in r.output
