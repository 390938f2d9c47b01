import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from llmkit.model.decoding import generate
from llmkit.hf.export import ExportConfig
from llmkit.hf.parity import PROBE_CHAT, compare_with_transformers, load_transformers
from llmkit.hf.tokenizer import hf_tokenizer_json
from llmkit.tokenizers.sentencepiece import CONFIG_FILE, MODEL_FILE, Tokenizer
from llmkit.data.tokenizer_training import TokenizerConfig, tokenizer_config_json, train_sentencepiece
from llmkit.checkpoints import step_folders as ckpt
from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run

runner = CliRunner()

# what the exported tokenizer must encode exactly as llmkit does
TEXTS = [
    "The model returns 42 tokens per step, not 7.",
    "我们的数据模型训练需要中文分词。",
    "def train(step):\n    if step > 10:\n\treturn step  # two  spaces\n        pass\n",
    "emoji 😀🎉 family 👩‍👩‍👧 and rare ✈ symbols",
    "digits 3.14159 1234567890 2024-01-01 ½",
    "  leading and trailing  \n\n\r\nlines",
    "<|user|>hi<|end|><|assistant|>ok<|end|>",
    "mixed 中文 and English\tand tabs",
]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py


def corpus() -> list[str]:
    words = ["the", "model", "data", "token", "train", "step", "return", "value", "print", "loss"]
    han = "我们的数据模型训练中文分词语言需要"
    docs = []
    for i in range(120):
        w = [words[(i * 7 + j * 3) % len(words)] for j in range(12)]
        docs += [" ".join(w) + f" {i * 37}.", "".join(han[(i + j) % len(han)] for j in range(20)) + "。",
                 f"def {w[0]}_{i}(x):\n    if x > {i}:\n\treturn x  # {w[1]} 😀\n",
                 f"{w[2]} 中文 {i}  mixed\ttext 🎉"]
    return docs


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    directory = tmp_path_factory.mktemp("tokenizer")
    cfg = TokenizerConfig(vocab_size=500)
    model, _ = train_sentencepiece(corpus(), cfg, log=lambda *a: None)
    (directory / MODEL_FILE).write_bytes(model)
    (directory / CONFIG_FILE).write_text(json.dumps(tokenizer_config_json(cfg, model)))
    return Tokenizer(directory)


ARCHS = {"dense": {}, "moe": dict(n_experts=4, experts_top_k=2, tie_embeddings=False)}


@pytest.fixture(scope="module", params=list(ARCHS))
def exported(request, tokenizer, tmp_path_factory):
    """A checkpoint run, its `llmkit export` folder, and that folder loaded by transformers."""
    ws = tmp_path_factory.mktemp("ws")
    # a large init spreads the logits, so greedy decoding does not repeat one token
    model = tiny_model(tokenizer.vocab_size, seed=1, init_std=0.3, **ARCHS[request.param]).eval()
    run = write_checkpoint_run(ws, "pretrain", model, tokenizer)
    out = ws / "hf"
    r = runner.invoke(build_app(), ["export", "--from", "pretrain", "-w", str(ws), "--to", str(out)])
    assert r.exit_code == 0, r.output
    hf_model, hf_tokenizer = load_transformers(out)
    return dict(ws=ws, run=run, out=out, model=model, hf_model=hf_model, hf_tokenizer=hf_tokenizer,
                arch=request.param)


def test_export_folder_loads_in_transformers_with_equal_logits(exported):
    hf = exported["hf_model"]
    assert type(hf).__name__ == ("MixtralForCausalLM" if exported["arch"] == "moe" else "LlamaForCausalLM")
    x = torch.randint(0, exported["model"].config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        diff = (exported["model"](x) - hf(x).logits).abs().max().item()
    assert diff <= 1e-4
    record = json.loads((exported["out"] / "llmkit_export.json").read_text())
    assert record["max_abs_logit_diff"] <= 1e-4 and record["greedy_tokens_equal"] and record["tokenizer_identical"]
    manifest = json.loads((exported["out"] / "manifest.json").read_text())
    assert manifest["stats"]["max_abs_logit_diff"] == record["max_abs_logit_diff"]
    assert json.loads((exported["out"] / "config.json").read_text())["dtype"] == "float32"


def test_greedy_generation_gives_the_same_tokens(exported, tokenizer):
    tok = tokenizer
    prompt = torch.tensor([[tok.bos_id] + tok.encode(TEXTS[0])])
    ours = generate(exported["model"], prompt, 24, greedy=True)
    config = transformers.GenerationConfig(max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                           eos_token_id=None, pad_token_id=tok.pad_id)
    theirs = exported["hf_model"].generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
    assert ours.tolist() == theirs.tolist()
    assert len(set(ours[0, prompt.shape[1]:].tolist())) >= 4  # a real sequence, not one repeated token


def test_exported_tokenizer_encodes_and_decodes_like_llmkit(exported, tokenizer):
    hf = exported["hf_tokenizer"]
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert hf.encode(text, add_special_tokens=False) == ids, text
        assert hf.encode(text) == [tokenizer.bos_id] + ids
        assert hf.decode(ids) == tokenizer.decode(ids) == text
    assert hf.decode([tokenizer.bos_id] + tokenizer.encode("hi") + [tokenizer.end_of_turn_id],
                     skip_special_tokens=True) == "hi"
    chat = hf.apply_chat_template(PROBE_CHAT, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert chat["input_ids"] == tokenizer.encode_chat(PROBE_CHAT, add_generation_prompt=True)[0]
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (tokenizer.bos_id, tokenizer.eos_id,
                                                                   tokenizer.pad_id)
    assert exported["hf_model"].generation_config.eos_token_id == [tokenizer.eos_id, tokenizer.end_of_turn_id]


def test_merges_follow_sentencepiece_scores(tokenizer):
    merges = hf_tokenizer_json(tokenizer)["model"]["merges"]
    joined = ["".join(m) for m in merges]
    scores = [tokenizer.sp.get_score(tokenizer.piece_to_id(p)) for p in joined]
    assert scores == sorted(scores, reverse=True)
    assert all(tokenizer.piece_to_id(p) != tokenizer.unk_id for m in merges for p in m)


def test_probe_detects_a_model_that_differs(exported, tokenizer):
    wrong = tiny_model(tokenizer.vocab_size, seed=2, init_std=0.3, **ARCHS[exported["arch"]]).eval()
    found = compare_with_transformers(wrong, tokenizer, exported["hf_model"], exported["hf_tokenizer"],
                                      ExportConfig())
    assert found["max_abs_logit_diff"] > 0.1 and not found["greedy_tokens_equal"]
    assert found["tokenizer_identical"]


def test_probe_uses_the_current_kv_cache_api_without_deprecation_warnings(exported, tokenizer):
    """transformers 5 renamed `past_key_values` to `cache` and removes the old name in 5.40: the
    probe's greedy loop must not lean on it (it warned on every step)."""
    import logging
    import warnings

    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("transformers").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = compare_with_transformers(exported["model"], tokenizer, exported["hf_model"],
                                              exported["hf_tokenizer"], ExportConfig())
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    said = [str(w.message) for w in caught] + messages
    assert found["greedy_tokens_equal"]
    assert not [m for m in said if "past_key_values" in m or "deprecated" in m.lower()], said


def test_rerun_is_up_to_date_and_bf16_export_casts_the_weights(exported, tmp_path):
    args = ["export", "--from", "pretrain", "-w", str(exported["ws"]), "--to", str(exported["out"])]
    r = runner.invoke(build_app(), args)
    assert r.exit_code == 0 and "up to date" in r.output
    out = tmp_path / "bf16"
    r = runner.invoke(build_app(), ["export", "--from", str(exported["run"] / "step-00000001"), "-w",
                                    str(exported["ws"]), "--to", str(out), "--set", "dtype=bfloat16",
                                    "--set", "probe=false"])
    assert r.exit_code == 0, r.output
    record = json.loads((out / "llmkit_export.json").read_text())
    assert record["dtype"] == "bfloat16" and record["max_abs_logit_diff"] is None
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    weights = ckpt.read_weights(out / "model.safetensors")
    assert {v.dtype for v in weights.values()} == {torch.bfloat16}


def test_import_of_an_export_round_trips_weights_exactly(exported, tokenizer):
    ws = exported["ws"]
    r = runner.invoke(build_app(), ["import", "--from", str(exported["out"]), "--out", "back", "-w", str(ws)])
    assert r.exit_code == 0, r.output
    original, imported = exported["run"] / "step-00000001", ws / "back" / "step-00000000"
    assert (ws / "back" / "latest").read_text().strip() == "step-00000000"
    assert ckpt.is_complete(imported) and (ws / "back" / "manifest.json").is_file()
    a, b = ckpt.read_weights(original / ckpt.WEIGHTS), ckpt.read_weights(imported / ckpt.WEIGHTS)
    assert a.keys() == b.keys()
    assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    assert json.loads((imported / "config.json").read_text()) == json.loads((original / "config.json").read_text())
    assert (imported / "tokenizer" / MODEL_FILE).read_bytes() == (original / "tokenizer" / MODEL_FILE).read_bytes()
    assert json.loads((imported / "tokenizer" / CONFIG_FILE).read_text()) == tokenizer.config
    model, tok = llmkit.load(ws / "back")
    x = torch.tensor([[tok.bos_id] + tok.encode(TEXTS[1])])
    assert torch.equal(model(x), exported["model"](x))


def test_import_of_sharded_transformers_checkpoint(tokenizer, tmp_path):
    config = transformers.LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, tie_word_embeddings=False, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    src = tmp_path / "hf"
    hf.save_pretrained(src, max_shard_size="40KB")
    assert (src / "model.safetensors.index.json").is_file()
    ws = tmp_path / "ws"
    r = runner.invoke(build_app(), ["import", "--from", str(src), "-w", str(ws), "--tokenizer", str(tokenizer.path)])
    assert r.exit_code == 0, r.output
    model, tok = llmkit.load(ws / "imported")
    assert model.config.norm_eps == 1e-6 and not model.config.tie_embeddings
    x = torch.tensor([[tok.bos_id] + tok.encode(TEXTS[2])])
    with torch.no_grad():
        assert (model(x) - hf(x).logits).abs().max() <= 1e-4


def test_import_errors_exit_2_and_say_what_to_do(tokenizer, tmp_path):
    ws = str(tmp_path / "ws")
    src = tmp_path / "hf"
    src.mkdir()
    r = runner.invoke(build_app(), ["import", "--from", str(src), "-w", ws])
    assert r.exit_code == 2 and "config.json" in r.output
    cfg = dict(model_type="llama", vocab_size=tokenizer.vocab_size - 8, hidden_size=32, intermediate_size=64,
               num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "pytorch_model.bin").write_bytes(b"pickle")
    r = runner.invoke(build_app(), ["import", "--from", str(src), "-w", ws])
    assert r.exit_code == 2 and "pickles are never loaded" in r.output
    (src / "pytorch_model.bin").unlink()
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).save_pretrained(src)
    r = runner.invoke(build_app(), ["import", "--from", str(src), "-w", ws])
    assert r.exit_code == 2 and "--tokenizer" in r.output  # no tokenizer.model in the folder
    r = runner.invoke(build_app(), ["import", "--from", str(src), "-w", ws, "--tokenizer", str(tokenizer.path)])
    # more ids than the model's embedding: an error; fewer is fine (below)
    assert r.exit_code == 2 and f"{tokenizer.vocab_size} tokens but the model's embedding has only" in r.output
    shutil.copyfile(tokenizer.path / MODEL_FILE, src / MODEL_FILE)
    (src / "tokenizer_config.json").unlink(missing_ok=True)
    r = runner.invoke(build_app(), ["import", "--from", str(src), "-w", ws])
    assert r.exit_code == 2 and f"has only {tokenizer.vocab_size - 8}" in r.output
    assert not (Path(ws) / "imported").exists()
    # an embedding padded past the tokenizer (Qwen2.5: 151,936 rows for 151,665 tokens) imports
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**cfg, "vocab_size": tokenizer.vocab_size + 8})
                                  ).save_pretrained(src)
    r = runner.invoke(build_app(), ["import", "--from", str(src), "-w", ws])
    assert r.exit_code == 0, r.output


def test_export_errors_exit_2(tokenizer, tmp_path):
    ws = tmp_path / "ws"
    r = runner.invoke(build_app(), ["export", "--from", "nothing", "-w", str(ws)])
    assert r.exit_code == 2 and "no checkpoint 'nothing'" in r.output
    write_checkpoint_run(ws, "ln", tiny_model(tokenizer.vocab_size, norm="layernorm"), tokenizer)
    r = runner.invoke(build_app(), ["export", "--from", "ln", "-w", str(ws)])
    assert r.exit_code == 2 and "layernorm" in r.output
    assert not (ws / "export" / "hf").exists()
