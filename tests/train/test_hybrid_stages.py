"""Every stage on the families of issue 51: a tiny random Qwen3.5 (a Gated DeltaNet layer beside a
gated full-attention one) and a tiny SmolLM3 (a layer without RoPE beside one with it), saved by
transformers' own classes with a byte-level BPE tokenizer and the family's chat template, imported
with `llmkit import`, then: continued pretraining (`pretrain --from`), sft, LoRA / QLoRA (nf4) / DoRA
sft, rm, dpo, kto, ppo and grpo, distill (the hybrid as teacher and as student), generate on
prompts of different lengths, eval (perplexity and an lm-eval task), judge, export to transformers,
extend-vocab, status and report. A Qwen3.5 sft killed by SIGKILL mid-run resumes to the bits of a
run never stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from typer.testing import CliRunner

import llmkit
from llmkit import checkpoints as ckpt
from llmkit.cli.app import build_app
from llmkit.train.metrics import read_metrics
from tests.test_hf_tokenizer import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe
from tests.test_vocab_extend import ENGLISH, chinese
from tests.train.posttrain_fixtures import (addition_rows, preference_rows, separable_pairs,
                                            write_dataset)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py
runner = CliRunner()
LINEAR, FULL = "linear_attention", "full_attention"
SMOLLM3_TEMPLATE = (Path(__file__).parents[1] / "assets" / "smollm3_chat_template.jinja").read_text(encoding="utf-8")
SMOLLM3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
SHAPE = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
             max_position_embeddings=512, tie_word_embeddings=False)
FAMILIES = {
    "qwen3_5": lambda vocab: transformers.Qwen3_5TextConfig(
        vocab_size=vocab, **SHAPE, head_dim=16, num_hidden_layers=2, layer_types=[LINEAR, FULL],
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=8,
        linear_conv_kernel_dim=4),
    "smollm3": lambda vocab: transformers.SmolLM3Config(
        vocab_size=vocab, **SHAPE, num_hidden_layers=2, no_rope_layers=[0, 1],  # layer 0 without RoPE
        pad_token_id=None, bos_token_id=None, eos_token_id=None),
}
TINY = ["--set", "warmup_steps=0", "--set", "micro_batch_size=2", "--set", "eval_every=0", "--set", "max_steps=2",
        "--set", "lr=1e-2"]
# SmolLM3's template writes a metadata block (cutoff, date, reasoning mode) into every system turn:
# ~140 tokens of a tokenizer of 800 ids
SEQ_LEN = {"qwen3_5": 64, "smollm3": 192}
GENERATIVE = ["--set", "eval_records=2", "--set", "max_new_tokens=3"]
# in place of the templates' default system turns (SmolLM3's is ~1,000 tokens of a vocabulary of 800)
SYSTEM = [{"role": "system", "content": "Add."}]
DEMO_EVAL = Path(__file__).parents[2] / "recipes/demo/data/eval"


def llmkit_cli(*args) -> str:
    r = runner.invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == 0, f"llmkit {' '.join(map(str, args))}:\n{r.output}"
    return r.output


def with_system(rows: list[dict]) -> list[dict]:
    """Rows with their prompt as a system and a user turn (`messages`, read before `prompt`)."""
    out = []
    for r in rows:
        messages = [*SYSTEM, {"role": "user", "content": r["prompt"] or r["messages"][0]["content"]}]
        if r.get("response") or r.get("messages"):
            messages.append({"role": "assistant", "content": r["answer"]})
        out.append({**r, "messages": messages})
    return out


def save_family(folder: Path, family: str) -> Path:
    template, specials = ((QWEN25_TEMPLATE, QWEN_SPECIALS) if family == "qwen3_5" else
                          (SMOLLM3_TEMPLATE, SMOLLM3_SPECIALS))
    pad = "<|endoftext|>" if family == "qwen3_5" else "<|end_of_text|>"
    backend = train_bpe(specials)
    save_folder(folder, backend, template, eos_token="<|im_end|>", pad_token=pad)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES[family](backend.get_vocab_size()))
    with torch.no_grad():  # norms and decay rates off their initial values, so that a detail shows
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def feedback_rows(n: int) -> list[dict]:
    return [{"id": f"{r['id']}-{k}", "prompt": r["prompt"], "completion": c, "label": not k,
             "answer": r["answer"]} for r in separable_pairs(n) for k, c in enumerate((r["chosen"], r["rejected"]))]


@pytest.fixture(scope="module", params=list(FAMILIES))
def pipeline(request, tmp_path_factory):
    """A workspace where the family's model was imported and every stage ran a few steps."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    folder = save_family(root / "hf", family)
    ws = root / "ws"
    tiny = [*TINY, "--set", f"seq_len={SEQ_LEN[family]}"]
    llmkit_cli("import", "--from", folder, "--out", "base", "-w", ws)
    prompts = [{"id": f"q{i}", "prompt": r["prompt"], "answer": r["answer"]} for i, r in
               enumerate(preference_rows(12, seed=1))]
    for name, rows in [("sft", addition_rows(12)), ("pref", preference_rows(12)), ("prompts", prompts),
                       ("feedback", feedback_rows(6))]:
        rows = with_system(rows)
        write_dataset(ws, f"{name}_train", rows[:10])
        write_dataset(ws, f"{name}_eval", rows[10:])
    write_dataset(ws, "corpus", [{"id": f"d{i}", "prompt": f"文档 {i}: the model reads this text. " * 3}
                                 for i in range(16)])
    llmkit_cli("tokenize", "--in", "corpus", "--tokenizer", "base", "-w", ws, "--set", "val_fraction=0")
    llmkit_cli("pretrain", "--from", "base", "--in", "tokens", "--out", "continued", "-w", ws,
               "--set", "max_steps=2", "--set", "warmup_steps=0", "--set", "micro_batch_size=2",
               "--set", "seq_len=32", "--set", "eval_every=0")
    llmkit_cli("sft", "--from", "base", "--eval", "sft_eval", "-w", ws, *tiny, *GENERATIVE)
    for out, options in [("sft_lora", ["lora.r=4"]), ("sft_qlora", ["lora.r=4", "lora.quant=nf4"]),
                         ("sft_dora", ["lora.r=4", "lora.use_dora=true"])]:
        llmkit_cli("sft", "--from", "base", "--in", "sft_train", "--out", out, "-w", ws, *tiny,
                   *[a for o in options for a in ("--set", o)])
    llmkit_cli("rm", "--from", "base", "--eval", "pref_eval", "-w", ws, *tiny)
    llmkit_cli("dpo", "--from", "sft", "--eval", "pref_eval", "-w", ws, *tiny, *GENERATIVE)
    llmkit_cli("kto", "--from", "sft", "--in", "feedback_train", "-w", ws, *tiny)
    for algo in ("grpo", "ppo"):
        llmkit_cli("ppo", "--from", "sft", "--reward", "rm", "--in", "prompts_train", "--out", algo, "-w", ws,
                   "--set", f"algo={algo}", "--set", "prompts_per_rollout=2", *tiny, *GENERATIVE)
    # the hybrid as teacher (sft) and as student (base): one tokenizer, so any two runs of a family
    llmkit_cli("distill", "--teacher", "sft", "--from", "base", "--in", "sft_train", "-w", ws, *tiny)
    return family, folder, ws


def stats(ws: Path, name: str) -> dict:
    return json.loads((ws / name / "manifest.json").read_text())["stats"]


def changed_tensors(ws: Path, before: str, after: str) -> list[str]:
    a, b = llmkit.load(ws / before)[0].state_dict(), llmkit.load(ws / after)[0].state_dict()
    return [k for k in b if not torch.equal(a[k], b[k])]


def test_import_gives_the_familys_layers(pipeline):
    family, folder, ws = pipeline
    model, _ = llmkit.load(ws / "base")
    if family == "qwen3_5":
        assert model.config.layer_types == [LINEAR, FULL] or tuple(model.config.layer_types) == (LINEAR, FULL)
    else:
        assert model.config.nope_layers
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < 1e-4


@pytest.mark.parametrize("stage, start", [("continued", "base"), ("sft", "base"), ("dpo", "sft"), ("kto", "sft"),
                                          ("grpo", "sft"), ("ppo", "sft"), ("distill", "base")])
def test_every_training_stage_trains_every_tensor_of_the_imported_model(pipeline, stage, start):
    family, _, ws = pipeline
    assert stats(ws, stage)["steps"] == 2
    changed = changed_tensors(ws, start, stage)
    assert len(changed) == len(llmkit.load(ws / stage)[0].state_dict()), family
