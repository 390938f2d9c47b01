"""Every stage on a model a user brings: tiny random Qwen2 and Qwen3 models with a byte-level BPE
tokenizer and a ChatML template, saved by transformers, imported with `llmkit import`, fine-tuned
with sft, rm, dpo and a short grpo, prompted with generate, exported; transformers loads the export
with the logits of llmkit's model. The Qwen2 embedding is padded past the tokenizer, as Qwen2.5's."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe
from tests.train.posttrain_fixtures import addition_rows, preference_rows, write_dataset

runner = CliRunner()

SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=128)
FAMILIES = {"qwen2": ("Qwen2Config", dict(tie_word_embeddings=True), 32),  # 32 padding rows
            "qwen3": ("Qwen3Config", dict(head_dim=24, tie_word_embeddings=False), 0)}
# sequences of 128: the template's default system message is long in a tokenizer of 800 ids
TINY = ["--set", "warmup_steps=0", "--set", "micro_batch_size=2", "--set", "eval_every=0",
        "--set", "seq_len=128", "--set", "max_steps=2"]
GENERATIVE = ["--set", "eval_records=4", "--set", "max_new_tokens=4"]
# a user's corpus for continued pretraining; some pages quote the model's document end
CORPUS = [f"文档 {i}: the model reads this text. 😀 " * 4 + ("GPT-2 ends texts with <|endoftext|>." if i % 8 == 0 else "")
          for i in range(40)]


def llmkit_cli(*args) -> str:
    r = runner.invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == 0, f"llmkit {' '.join(map(str, args))}:\n{r.output}"
    return r.output


@pytest.fixture(scope="module")
def tokenizer_backend():
    return train_bpe(QWEN_SPECIALS)


@pytest.fixture(scope="module", params=list(FAMILIES))
def pipeline(request, tokenizer_backend, tmp_path_factory):
    """A workspace where the family's model was imported and every post-training stage ran."""
    cls, settings, padding = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    folder = save_folder(root / "hf", tokenizer_backend, QWEN25_TEMPLATE, eos_token="<|im_end|>",
                         pad_token="<|endoftext|>")
    vocab = tokenizer_backend.get_vocab_size() + padding
    config = getattr(transformers, cls)(vocab_size=vocab, **SHAPE, **settings)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    ws = root / "ws"
    llmkit_cli("import", "--from", folder, "--out", "base", "-w", ws)
    prompts = [{"id": f"q{i}", "prompt": r["prompt"], "answer": r["answer"]} for i, r in
               enumerate(preference_rows(28, seed=1))]
    for name, rows in [("sft", addition_rows(28)), ("pref", preference_rows(28)), ("prompts", prompts)]:
        write_dataset(ws, f"{name}_train", rows[:24])
        write_dataset(ws, f"{name}_eval", rows[24:])  # scored by exact match before and after
    # continued pretraining on the user's corpus, tokenized with the imported model's own tokenizer
    write_dataset(ws, "corpus", [{"id": f"d{i}", "prompt": text}  # (write_dataset's text is the prompt)
                                 for i, text in enumerate(CORPUS)])
    llmkit_cli("tokenize", "--in", "corpus", "--tokenizer", "base", "-w", ws, "--set", "val_fraction=0")
    llmkit_cli("pretrain", "--from", "base", "--in", "tokens", "--out", "continued", "-w", ws,
               "--set", "max_steps=2", "--set", "warmup_steps=0", "--set", "micro_batch_size=2",
               "--set", "seq_len=32", "--set", "eval_every=0")
    llmkit_cli("ppl-filter", "--in", "corpus", "--model", "base", "-w", ws)
    llmkit_cli("eval", "--from", "base", "-w", ws, "--set", "tokens=null", "--set", "ppl.datasets=corpus")
    llmkit_cli("sft", "--from", "base", "--eval", "sft_eval", "-w", ws, *TINY, *GENERATIVE)
    llmkit_cli("dpo", "--from", "sft", "--eval", "pref_eval", "-w", ws, *TINY, *GENERATIVE)
    llmkit_cli("rm", "--from", "base", "--eval", "pref_eval", "-w", ws, *TINY)
    # rewarded by the reward model: an untrained policy's replies are never right, so exact match
    # would give every sample 0 and grpo's group-relative advantages nothing to learn from
    llmkit_cli("ppo", "--from", "sft", "--reward", "rm", "--eval", "prompts_eval", "-w", ws,
               "--set", "algo=grpo", "--set", "prompts_per_rollout=2", *TINY, *GENERATIVE)
    return request.param, folder, ws, vocab


def stats(ws, name: str) -> dict:
    return json.loads((ws / name / "manifest.json").read_text())["stats"]


def test_import_keeps_the_family_and_the_models_own_tokenizer(pipeline):
    family, folder, ws, vocab = pipeline
    model, tokenizer = llmkit.load(ws / "base")
    assert model.config.vocab_size == vocab and tokenizer.vocab_size <= vocab
    assert (model.config.attention_bias, model.config.qk_norm) == (family == "qwen2", family == "qwen3")
    step = ws / "base" / "step-00000000" / "tokenizer"
    assert (step / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert tokenizer.bos_id is None and tokenizer.decode([tokenizer.eos_id, tokenizer.end_of_turn_id]) == ""
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.randint(0, tokenizer.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < 1e-4


@pytest.mark.parametrize("stage, start", [("sft", "base"), ("dpo", "sft"), ("ppo", "sft")])
def test_post_training_stages_train_the_imported_model(pipeline, stage, start):
    _, _, ws, _ = pipeline
    s = stats(ws, stage)
    assert s["steps"] == 2 and s["eval_records"] == 4 and 0.0 <= s["accuracy"] <= 1.0
    before, _ = llmkit.load(ws / start)
    after, _ = llmkit.load(ws / stage)
    changed = [k for k, v in after.state_dict().items() if not torch.equal(v, before.state_dict()[k])]
    assert len(changed) == len(after.state_dict())  # every tensor, q/k/v biases and q/k norms included


def test_the_reward_model_trains_on_the_imported_trunk(pipeline):
    from llmkit.checkpoints.loading import load_reward_model

    _, _, ws, _ = pipeline
    s = stats(ws, "rm")
    assert s["steps"] == 2 and 0.0 <= s["accuracy"] <= 1.0
    trunk, _ = llmkit.load(ws / "base")
    reward_model = load_reward_model(ws / "rm")
    assert not torch.equal(reward_model.model.embed_tokens.weight, trunk.model.embed_tokens.weight)


def test_continued_pretraining_reads_the_corpus_tokenized_by_the_models_own_tokenizer(pipeline):
    _, _, ws, _ = pipeline
    model, tokenizer = llmkit.load(ws / "base")
    import numpy as np

    tokens = json.loads((ws / "tokens" / "manifest.json").read_text())["stats"]
    _, lengths = tokenizer.encode_flat(CORPUS)
    assert tokens["tokens"] == int(lengths.sum()) + len(CORPUS)  # each, then <|endoftext|>
    shards = np.concatenate([np.fromfile(f, tokens["dtype"]) for f in sorted((ws / "tokens" / "train").glob("*.bin"))])
    # a quoted <|endoftext|> is text: the only document ends are the 40 written after the documents
    assert (shards == tokenizer.eos_id).sum() == len(CORPUS) and shards[-1] == tokenizer.eos_id
    assert stats(ws, "continued")["steps"] == 2
    continued, _ = llmkit.load(ws / "continued")
    assert continued.config == model.config
    assert not torch.equal(continued.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_ppl_filter_and_eval_score_with_the_imported_model(pipeline):
    _, _, ws, _ = pipeline
    filtered = stats(ws, "filtered")
    assert filtered["rows_in"] == 40 == filtered["rows_out"] + filtered["rows_removed"]
    ppl = json.loads((ws / "eval" / "base" / "results.json").read_text())["ppl"]["corpus"]
    _, tokenizer = llmkit.load(ws / "base")
    assert ppl["docs"] == 40
    assert tokenizer.vocab_size / 2 < ppl["ppl"] < tokenizer.vocab_size * 2  # a random model: ~ the vocabulary


def test_sft_learns_only_the_replies_in_the_models_chat_template(pipeline):
    _, _, ws, _ = pipeline
    _, tokenizer = llmkit.load(ws / "sft")
    ids, mask = tokenizer.encode_chat([{"role": "user", "content": "What is 2+2?"},
                                       {"role": "assistant", "content": "4"}])
    assert tokenizer.format_chat([{"role": "user", "content": "x"}]).startswith("<|im_start|>system\n")
    learnt = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert learnt == "4" and ids[[i for i, m in enumerate(mask) if m][-1]] == tokenizer.end_of_turn_id


def test_generate_prompts_the_fine_tuned_model_through_its_template(pipeline):
    _, _, ws, _ = pipeline
    out = llmkit_cli("generate", "--from", "dpo", "-w", ws, "--prompt", "What is 12+30?",
                     "--set", "max_new_tokens=3", "--set", "greedy=true")
    assert out.startswith("dpo was trained on chats") or ">>> What is 12+30?" in out


def test_the_export_is_the_family_it_came_from_and_transformers_gives_its_logits(pipeline, tmp_path):
    family, folder, ws, _ = pipeline
    llmkit_cli("export", "--from", "dpo", "--to", tmp_path / "out", "-w", ws)
    exported = json.loads((tmp_path / "out" / "config.json").read_text())
    assert exported["architectures"] == [{"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[family]]
    record = json.loads((tmp_path / "out" / "llmkit_export.json").read_text())
    assert record["max_abs_logit_diff"] < 1e-4 and record["greedy_tokens_equal"]
    assert record["tokenizer_identical"]  # the chat template renders the same ids too
    model, tokenizer = llmkit.load(ws / "dpo")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    text = "What is 12+30? 你好 😀"
    assert hf_tok.encode(text, add_special_tokens=False) == tokenizer.encode(text)
    ids = torch.tensor([tokenizer.document_start_ids() + tokenizer.encode(text)])
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < 1e-4
    llmkit_cli("import", "--from", tmp_path / "out", "--out", "back", "-w", ws)
    back, _ = llmkit.load(ws / "back")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in back.state_dict().items())
