"""`llmkit extend-vocab` on a model a user brings: tiny random Qwen2 (tied, embedding padded past the
tokenizer, as Qwen2.5's) and Qwen3 (untied) models with a byte-level BPE tokenizer and a ChatML
template, imported, extended with Han pieces trained on a Chinese corpus, then read by transformers
and by the later stages."""

from __future__ import annotations

import json
import random

import pytest
import torch
import transformers
from typer.testing import CliRunner

import llmkit
from llmkit.checkpoints.step_folders import read_weights
from llmkit.tokenizers.cjk import COMMON_HAN
from llmkit.cli.app import build_app
from llmkit.hf.bpe_extend import script_bytes_test, token_bytes
from llmkit.tokenizers.tokenizer_json import HFTokenizer
from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe
from tests.train.posttrain_fixtures import addition_rows, write_dataset

runner = CliRunner()
SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=256)
FAMILIES = {"qwen2": ("Qwen2Config", dict(tie_word_embeddings=True), 32),
            "qwen3": ("Qwen3Config", dict(head_dim=24, tie_word_embeddings=False), 0)}
HAN = sorted(COMMON_HAN)[:120]
ENGLISH = ["def load(path):\n    return json.loads(open(path).read())  # the config\n",
           "The model reads this text, then answers the question. It's 42!",
           "Ünïcödé, emoji 😀 and tabs\tstay as they were: <|endoftext|> is text here."]
CHAT = [{"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris is the capital of France."}]


def chinese(n: int, seed: int) -> list[str]:
    """Poem-like lines: words of 1-3 characters from a fixed set, punctuation, an English word."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(HAN) for _ in range(rng.randint(1, 3))) for _ in range(60)]
    return ["，".join("".join(rng.choice(words) for _ in range(3)) for _ in range(4)) + "。 2024\n"
            for _ in range(n)]


def run(*args, code: int = 0) -> str:
    r = runner.invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == code, f"llmkit {' '.join(map(str, args))}:\n{r.output}"
    assert "Traceback" not in r.output
    return r.output


@pytest.fixture(scope="module")
def backend():
    return train_bpe(QWEN_SPECIALS)


@pytest.fixture(scope="module", params=list(FAMILIES))
def extended(request, backend, tmp_path_factory):
    """(family, workspace) where `base` was imported and `zh` extended from it on the corpus `zh_text`."""
    cls, settings, padding = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    folder = save_folder(root / "hf", backend, QWEN25_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    config = getattr(transformers, cls)(vocab_size=backend.get_vocab_size() + padding, **SHAPE, **settings)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    ws = root / "ws"
    run("import", "--from", folder, "--out", "base", "-w", ws)
    docs = [{"id": f"zh{i}", "prompt": t} for i, t in enumerate(chinese(300, seed=1))]
    docs += [{"id": f"en{i}", "prompt": t} for i, t in enumerate(ENGLISH * 10)]
    write_dataset(ws, "zh_text", docs)
    run("extend-vocab", "--from", "base", "--in", "zh_text", "--out", "zh", "-w", ws,
        "--set", "new_tokens=150", "--set", "heldout_fraction=0.1")
    return request.param, ws


def tokenizers_of(ws):
    return HFTokenizer(ws / "base/step-00000000/tokenizer"), HFTokenizer(ws / "zh/step-00000000/tokenizer")


def test_chinese_takes_fewer_tokens_and_other_text_keeps_its_ids(extended):
    _, ws = extended
    old, new = tokenizers_of(ws)
    held_out = chinese(40, seed=2)
    assert sum(map(len, new.encode_batch(held_out))) <= 0.7 * sum(map(len, old.encode_batch(held_out)))
    assert new.encode_batch(ENGLISH) == old.encode_batch(ENGLISH)
    texts = held_out + ENGLISH + ["混合 mixed 文本 😀 ok"]
    ids, counts = new.encode_flat(texts)  # as a corpus is read: <|endoftext|> in a text is text
    assert new.decode(ids) == "".join(texts) and len(ids) == counts.sum()
    assert all(new.decode(new.encode(text)) == text for text in texts if "<|" not in text)
    stats = json.loads((ws / "zh/manifest.json").read_text())["stats"]
    assert stats["new_tokens"] == 150 and stats["unchanged_docs"] == stats["docs_without_script"] > 0
    assert stats["tokens_per_char"]["zh"]["fewer_pct"] >= 30 and stats["roundtrip_failures"] == 0


def test_new_merges_follow_the_old_ones_and_join_only_han_bytes(extended):
    _, ws = extended
    old = json.loads((ws / "base/step-00000000/tokenizer/tokenizer.json").read_text())["model"]
    new = json.loads((ws / "zh/step-00000000/tokenizer/tokenizer.json").read_text())["model"]
    assert new["merges"][:len(old["merges"])] == old["merges"]
    assert {k: new["vocab"][k] for k in old["vocab"]} == old["vocab"]
    han_only = script_bytes_test("han")
    added = [t for t in new["vocab"] if t not in old["vocab"]]
    assert len(added) == 150 and all(han_only(token_bytes(t)) for t in added)


def test_autotokenizer_gives_llmkits_ids_and_the_same_chat(extended):
    _, ws = extended
    old, new = tokenizers_of(ws)
    hf_new = transformers.AutoTokenizer.from_pretrained(new.path)
    hf_old = transformers.AutoTokenizer.from_pretrained(old.path)
    for text in chinese(5, seed=3) + ENGLISH[:2]:
        assert hf_new(text, add_special_tokens=False)["input_ids"] == new.encode(text)
    assert hf_new.apply_chat_template(CHAT, tokenize=False) == hf_old.apply_chat_template(CHAT, tokenize=False)
    assert new.encode_chat(CHAT) == old.encode_chat(CHAT)
    assert (new.eos_id, new.end_of_turn_id, new.pad_id) == (old.eos_id, old.end_of_turn_id, old.pad_id)


def test_new_rows_are_the_mean_of_the_pieces_they_replace(extended):
    family, ws = extended
    old, new = tokenizers_of(ws)
    before = read_weights(ws / "base/step-00000000/model.safetensors")
    after = read_weights(ws / "zh/step-00000000/model.safetensors")
    names = ["model.embed_tokens.weight"] + (["lm_head.weight"] if family == "qwen3" else [])
    rows = before[names[0]].shape[0]
    for name in names:
        assert after[name].shape[0] == max(rows, new.vocab_size)
        assert torch.equal(after[name][:old.vocab_size], before[name][:old.vocab_size])
        for i in range(old.vocab_size, new.vocab_size, 37):
            parts = old.encode(new.decode([i]))  # whole characters: they decode to text
            if new.decode([i]) and len(new.encode(new.decode([i]))) == 1:
                assert torch.allclose(after[name][i], before[name][parts].mean(0), atol=1e-6)
    tied = family == "qwen2"
    model, _ = llmkit.load(ws / "zh")
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied


def test_the_extended_model_exports_with_transformers_logits_and_fine_tunes_with_lora(extended):
    family, ws = extended
    out = run("export", "--from", "zh", "-w", ws, "--set", "probe_tokens=16", "--set", "probe_new_tokens=2")
    record = json.loads((ws / "export/hf/llmkit_export.json").read_text())
    assert record["max_abs_logit_diff"] <= 1e-4 and record["greedy_tokens_equal"], out
    _, new = tokenizers_of(ws)
    exported = transformers.AutoTokenizer.from_pretrained(ws / "export/hf")
    text = chinese(1, seed=4)[0]
    assert exported(text, add_special_tokens=False)["input_ids"] == new.encode(text)
    if family == "qwen2":  # one family is enough for GGUF and the trainers
        run("export", "--from", "zh", "--format", "gguf", "--to", ws / "gguf", "-w", ws,
            "--set", "probe_tokens=16", "--set", "probe_new_tokens=2")
        gguf = json.loads((ws / "gguf/llmkit_export.json").read_text())
        assert gguf["tokenizer_identical"] is not False and gguf["greedy_tokens_equal"] is not False, gguf
        write_dataset(ws, "sft_train", addition_rows(8))
        run("sft", "--from", "zh", "-w", ws, "--set", "lora.r=4", "--set", "max_steps=1", "--set", "warmup_steps=0",
            "--set", "micro_batch_size=2", "--set", "seq_len=128", "--set", "eval_every=0")
        model, tokenizer = llmkit.load(ws / "sft")
        assert model.config.vocab_size >= new.vocab_size and tokenizer.encode(text) == new.encode(text)


def test_extending_by_pieces_it_already_has_is_refused_with_exit_2(extended):
    _, ws = extended
    old, new = tokenizers_of(ws)
    pieces = [t for t in (new.decode([i]) for i in range(old.vocab_size, new.vocab_size)) if len(new.encode(t)) == 1]
    write_dataset(ws, "known", [{"id": f"k{i}", "prompt": "，".join(pieces[i::3])} for i in range(3)])
    out = run("extend-vocab", "--from", "zh", "--in", "known", "--out", "again", "-w", ws,
              "--set", "heldout_fraction=0", code=2)
    assert "0 new pieces" in out and not (ws / "again").exists()


def test_a_corpus_without_the_script_is_refused_with_exit_2(extended):
    _, ws = extended
    write_dataset(ws, "en_text", [{"id": f"e{i}", "prompt": t} for i, t in enumerate(ENGLISH * 4)])
    out = run("extend-vocab", "--from", "base", "--in", "en_text", "--out", "en", "-w", ws, code=2)
    assert "no training document holds a han character" in out and "en_text" in out


def test_a_sentencepiece_model_is_refused_with_exit_2(extended, tmp_path):
    import shutil

    _, ws = extended
    shutil.copytree(ws / "base", ws / "spm")
    tokenizer = ws / "spm/step-00000000/tokenizer"
    (tokenizer / "tokenizer.model").write_bytes(b"a sentencepiece model")
    out = run("extend-vocab", "--from", "spm", "--in", "zh_text", "--out", "x", "-w", ws, code=2)
    assert "sentencepiece" in out and "byte-level BPE" in out.replace("\n", " ")


def lora_pretrain(ws, out: str, *sets: str, kill_at: str | None = None) -> int:
    """`llmkit pretrain --from zh` with LoRA on the Chinese tokens, in its own process (a kill is real)."""
    import os
    import subprocess
    import sys

    if not (ws / "tokens-zh/manifest.json").is_file():
        run("tokenize", "--in", "zh_text", "--tokenizer", "zh", "--out", "tokens-zh", "-w", ws,
            "--set", "val_fraction=0")
    args = [a for p in ["lora.r=4", "lora.alpha=8", "micro_batch_size=2", "seq_len=32", "lr=5e-2", "min_lr=5e-3",
                        "warmup_steps=0", "eval_every=0", "save_every=2", *sets] for a in ("--set", p)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LLMKIT_KILL_AT")}
    env.update(OMP_NUM_THREADS="1", **({"LLMKIT_KILL_AT": kill_at} if kill_at else {}))
    return subprocess.run([sys.executable, "-c", "from llmkit.cli.app import main; main()", "pretrain", "--from",
                           "zh", "--in", "tokens-zh", "--out", out, "-w", str(ws), *args],
                          env=env, capture_output=True, text=True, timeout=600).returncode


def test_lora_trains_the_new_rows_only_saves_resumes_and_merges_them(extended):
    """Under LoRA the new pieces' embedding rows (and an untied head's) train beside the adapters and
    every old row stays the base's; the adapter file holds them as peft does, a killed run resumes to
    the same rows, and the merged model exports and imports back with them."""
    from safetensors.torch import load_file

    family, ws = extended
    old, new = tokenizers_of(ws)
    assert lora_pretrain(ws, "cpt", "max_steps=4") == 0
    assert lora_pretrain(ws, "killed", "max_steps=4", kill_at="checkpoint@2") == -9
    assert lora_pretrain(ws, "killed", "max_steps=4") == 0
    step = ws / "cpt/step-00000004"
    saved = load_file(str(step / "adapter_model.safetensors"))
    resumed = load_file(str(ws / "killed/step-00000004/adapter_model.safetensors"))
    assert saved.keys() == resumed.keys() and all(torch.equal(saved[k], resumed[k]) for k in saved)
    heads = ["model.embed_tokens"] + (["lm_head"] if family == "qwen3" else [])  # a tied head reads the embedding's
    rows = {f"base_model.model.{h}.token_adapter.trainable_tokens_delta": h for h in heads}
    assert {k for k in saved if "trainable_tokens" in k} == set(rows)
    new_ids = list(range(old.vocab_size, new.vocab_size))
    assert all(saved[k].shape == (len(new_ids), SHAPE["hidden_size"]) for k in rows)
    config = json.loads((step / "adapter_config.json").read_text())
    assert config["trainable_token_indices"] == {h.split(".")[-1]: new_ids for h in heads}

    base, _ = llmkit.load(ws / "zh")
    merged, _ = llmkit.load(ws / "cpt")
    for module in heads:
        before, after = base.get_submodule(module).weight, merged.get_submodule(module).weight
        assert torch.equal(after[:old.vocab_size], before[:old.vocab_size])
        assert torch.equal(after[new_ids], saved[f"base_model.model.{module}.token_adapter.trainable_tokens_delta"])
        assert not torch.allclose(after[new_ids], before[new_ids])
    assert (merged.lm_head.weight is merged.model.embed_tokens.weight) == (family == "qwen2")

    run("export", "--from", "cpt", "--to", ws / "cpt-hf", "-w", ws, "--set", "probe_tokens=16",
        "--set", "probe_new_tokens=2")
    assert json.loads((ws / "cpt-hf/llmkit_export.json").read_text())["max_abs_logit_diff"] <= 1e-4
    run("import", "--from", ws / "cpt-hf", "--out", "cpt-back", "-w", ws)
    back = read_weights(ws / "cpt-back/step-00000000/model.safetensors")
    for module in heads:
        assert torch.equal(back[f"{module}.weight"], merged.get_submodule(module).weight.detach())


def test_peft_reads_the_adapters_on_the_exported_base(extended):
    """adapter_model.safetensors + adapter_config.json (trainable_token_indices) load with
    `PeftModel.from_pretrained` onto transformers' copy of the extended model: its logits are llmkit's."""
    import peft

    family, ws = extended
    if not (ws / "cpt/manifest.json").is_file():
        assert lora_pretrain(ws, "cpt", "max_steps=4") == 0
    run("export", "--from", "zh", "--to", ws / "zh-hf", "-w", ws, "--set", "probe_tokens=8",
        "--set", "probe_new_tokens=1")
    hf = transformers.AutoModelForCausalLM.from_pretrained(ws / "zh-hf", dtype=torch.float32)
    adapted = peft.PeftModel.from_pretrained(hf, ws / "cpt/step-00000004").eval()
    merged, tokenizer = llmkit.load(ws / "cpt")
    ids = torch.tensor([tokenizer.encode(chinese(1, seed=5)[0])])
    assert ids.max() >= tokenizers_of(ws)[0].vocab_size  # the text uses new pieces
    with torch.no_grad():
        assert torch.allclose(adapted(ids).logits, merged.eval()(ids), atol=1e-4)


@pytest.mark.parametrize("change, says", [
    ({"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}},
     "not byte-level"),  # Llama 2 / Mistral's tokenizer.json: sentencepiece-style BPE with byte fallback
    ({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "a": 1}}}, "not BPE")])
def test_a_tokenizer_json_that_is_not_byte_level_bpe_is_refused_with_exit_2(extended, change, says):
    import shutil

    _, ws = extended
    shutil.rmtree(ws / "other", ignore_errors=True)
    shutil.copytree(ws / "base", ws / "other")
    path = ws / "other/step-00000000/tokenizer/tokenizer.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    out = run("extend-vocab", "--from", "other", "--in", "zh_text", "--out", "y", "-w", ws, code=2)
    assert says in out and "tokenizer.json" in out and not (ws / "y").exists()
