"""Training a tokenizer: coverage planned to fit the vocabulary, the stage's artifact and
fertility, the bounded training sample."""

import json
import random

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.tokenizers.sentencepiece import Tokenizer
from llmkit.data.tokenizer_training import (TokenizerConfig, TrainingSample, split_sentences,
                                       tokenizer_config_json, train_sentencepiece)
from tests.conftest import write_jsonl
from tests.tokenizers.test_sentencepiece import small_corpus


def zipf_cjk_corpus(n_docs=200, distinct=1500, seed=1) -> list[str]:
    """~1100 distinct characters at coverage 0.9995, ~650 at 0.98."""
    rng = random.Random(seed)
    chars = [chr(0x4E00 + 7 * i) for i in range(distinct)]
    weights = [1 / (i + 1) ** 1.3 for i in range(distinct)]
    return ["".join(rng.choices(chars, weights, k=120)) + " ok\n" for _ in range(n_docs)]


def test_small_vocabulary_lowers_coverage_and_rare_characters_become_bytes(tmp_path):
    texts = zipf_cjk_corpus()
    messages = []
    cfg = TokenizerConfig(vocab_size=1100)
    model, plan = train_sentencepiece(texts, cfg, log=messages.append)
    assert plan.lowered and 0.98 <= plan.used < 0.9995
    assert plan.required_chars == 1100 - 4 - 4 - 256  # every free piece holds a character
    assert "lowered it to" in messages[0] and "fall back to UTF-8 bytes" in messages[0]
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer.model").write_bytes(model)
    (d / "tokenizer_config.json").write_text(json.dumps(tokenizer_config_json(cfg, model)))
    tok = Tokenizer(d)
    rare = chr(0x4E00 + 7 * 1499)
    assert [tok.id_to_piece(i) for i in tok.encode(rare)] == [
        f"<0x{b:02X}>" for b in rare.encode()]
    assert all(tok.decode(ids) == t for t, ids in zip(texts, tok.encode_batch(texts)))


def test_too_small_vocabulary_exits_2_naming_the_smallest_that_works(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"id": str(i), "text": t}
                                              for i, t in enumerate(zipf_cjk_corpus())])
    ws = str(tmp_path / "ws")
    app = build_app()
    assert CliRunner().invoke(app, ["ingest", str(data), "-w", ws]).exit_code == 0
    r = CliRunner().invoke(app, ["tokenizer", "-w", ws, "--in", "raw", "--vocab-size", "400"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    smallest = int(r.output.split("smallest vocabulary that works is ")[1].split(":")[0])
    r = CliRunner().invoke(app, ["tokenizer", "-w", ws, "--in", "raw",
                                 "--vocab-size", str(smallest)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["tokenizer", "-w", ws, "--in", "raw", "--force",
                                 "--vocab-size", str(smallest - 1)])
    assert r.exit_code == 2


def test_tokenizer_stage_writes_model_config_and_fertility(tmp_path):
    rows = [{"id": f"d{i}", "text": t, "lang": "zh" if i % 4 == 2 else "en"}
            for i, t in enumerate(small_corpus(200))]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    ws = tmp_path / "ws"
    app = build_app()
    assert CliRunner().invoke(app, ["ingest", str(data), "-w", str(ws)]).exit_code == 0
    r = CliRunner().invoke(app, ["tokenizer", "-w", str(ws), "--in", "raw",
                                 "--set", "vocab_size=400", "--set", "heldout_fraction=0.1"])
    assert r.exit_code == 0, r.output
    art = ws / "tokenizer"
    cfg = json.loads((art / "tokenizer_config.json").read_text())
    assert cfg["vocab_size"] == 400 and cfg["jieba"] is False
    assert {k: v["id"] for k, v in cfg["special_tokens"].items()}["eos"] == 2
    assert cfg["special_tokens"]["assistant"]["piece"] == "<|assistant|>"
    stats = json.loads((art / "manifest.json").read_text())["stats"]
    assert stats["vocab_size"] == 400 and stats["roundtrip_failures"] == 0
    assert stats["heldout_docs"] > 0
    assert stats["sample_sentences"] + stats["heldout_docs"] == 200
    assert set(stats["fertility"]) == {"en", "zh"} and stats["no_fertility"] is None
    assert all(f["tokens_per_char"] > 0 and f["tokens_per_word"] > 0
               for f in stats["fertility"].values())
    assert Tokenizer.load(art).vocab_size == 400


@pytest.mark.parametrize("setting, why", [
    ("heldout_fraction=0", "heldout_fraction=0 holds no document out of training"),
    ("heldout_fraction=0.001", "none of the 200 documents was drawn as held-out text")])
def test_no_held_out_text_is_said_aloud_and_recorded(tmp_path, setting, why):
    data = write_jsonl(tmp_path / "d.jsonl", [{"id": f"d{i}", "text": t}
                                              for i, t in enumerate(small_corpus(200))])
    ws = tmp_path / "ws"
    app = build_app()
    assert CliRunner().invoke(app, ["ingest", str(data), "-w", str(ws)]).exit_code == 0
    r = CliRunner().invoke(app, ["tokenizer", "-w", str(ws), "--in", "raw",
                                 "--set", "vocab_size=400", "--set", setting])
    assert r.exit_code == 0, r.output
    assert f"warning: tokenizer: no fertility measured: {why}" in r.output
    stats = json.loads((ws / "tokenizer" / "manifest.json").read_text())["stats"]
    assert stats["fertility"] == {} and stats["no_fertility"].startswith(why)


def test_training_sample_is_bounded_and_independent_of_input_order():
    docs = [(f"id{i}", f"line {i}\n" * (1 + i % 3)) for i in range(300)]
    a, b = TrainingSample(120, seed=0), TrainingSample(120, seed=0)
    for d in docs:
        a.add(*d, max_chars=100)
    for d in reversed(docs):
        b.add(*d, max_chars=100)
    assert len(a.sentences()) == 120 and a.sentences() == b.sentences()
    assert a.sentences_seen == 300


def test_sentences_are_bounded_and_join_back_to_the_document():
    text = "short line\n" + "x" * 250 + "\n" + "tail\n" * 30
    parts = split_sentences(text, 64)
    assert "".join(parts) == text and max(map(len, parts)) <= 64
