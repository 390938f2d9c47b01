import gzip
import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.errors import UserError
from llmkit.tokenizer import (END_OF_TURN, ROLE_TOKENS, Tokenizer, TokenizerConfig,
                              TrainingSample, jieba_boundaries, split_sentences,
                              tokenizer_config_json, train_sentencepiece)
from tests.conftest import write_jsonl

DEMO = Path(__file__).resolve().parents[1] / "recipes" / "demo" / "data" / "raw"

# what a tokenizer must give back byte for byte
EDGE_CASES = [
    "def f(x):\n\tif x:\n\t\treturn  x  # two  spaces\n",
    "    indented\n        deeper\n\n\n",
    "emoji 😀🎉 family 👩‍👩‍👧 flag 🇨🇳",
    "中文测试，全角　空格。\n第二行",
    "mixed 中文 and English 1234567890 digits",
    "literal meta ▁ and ▁▁ twice▁",
    "nul\x00char and \r\n windows lines\r\n",
    "   leading and trailing   ",
    "<|user|>hi<|end|> <s></s><pad><unk><0x41>",
    "", " ", "\t", "\n", "  \t \n ",
    "▅ block char",
    "ﬁ ligature, é (NFC) vs é (NFD)",
    "\u200b zero width \ufeff bom \u3000 ideographic space",
    "日本語のテキスト、カタカナ",
    "😀" * 40,
    "a" * 3000,
    "中" * 2000,
]


def demo_texts(skip_source: str | None = None) -> list[str]:
    texts = []
    for f in sorted(DEMO.glob("*.jsonl*")):
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("text"), str) and (
                        skip_source is None or rec.get("source") != skip_source):
                    texts.append(rec["text"])
    assert len(texts) > 1000, "the demo corpus is missing"
    return texts


def small_corpus(n: int = 80, seed: int = 0) -> list[str]:
    """Code, prose, tabs, emoji and Chinese — enough text for a ~400-piece vocabulary."""
    rng = random.Random(seed)
    words = ["the", "model", "data", "token", "train", "value", "return", "error", "file",
             "def", "class", "import", "print", "list", "under", "over", "loss", "step"]
    han = "我们的数据模型训练中文分词语言大学生活动工作时间问题"
    docs = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            docs.append(" ".join(rng.choice(words) for _ in range(40)) + ".\n")
        elif kind == 1:
            docs.append(f"def f{i}(x):\n\tif x > {i}:\n\t\treturn  x  # {rng.choice(words)}\n"
                        f"    print('{rng.choice(words)} 😀')\n")
        elif kind == 2:
            docs.append("".join(rng.choice(han) for _ in range(60)) + "。\n")
        else:
            docs.append(f"{rng.choice(words)} 中文 {i * 37}  mixed\ttext 🎉\n")
    return docs


def build_tokenizer(directory: Path, texts: list[str], **cfg) -> Tokenizer:
    config = TokenizerConfig(**cfg)
    sentences = [s for t in texts for s in split_sentences(t, config.max_sentence_chars)]
    model, _ = train_sentencepiece(sentences, config, log=lambda msg: None)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.model").write_bytes(model)
    (directory / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config_json(config, model)))
    return Tokenizer(directory)


@pytest.fixture(scope="module")
def demo_tok(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"), demo_texts() + EDGE_CASES,
                           vocab_size=8000)


def test_round_trip_is_exact_on_every_demo_document_and_edge_case(demo_tok):
    texts = demo_texts() + EDGE_CASES
    encoded = demo_tok.encode_batch(texts)
    bad = [t[:60] for t, ids in zip(texts, encoded) if demo_tok.decode(ids) != t]
    assert bad == []
    assert all(demo_tok.unk_id not in ids for ids in encoded)


def test_chunk_cache_gives_sentencepieces_ids_in_english_and_chinese(demo_tok):
    texts = [t for t in demo_texts() + EDGE_CASES if "▁" not in t]
    assert any("中" in t for t in texts) and any("the" in t for t in texts)
    assert demo_tok.encode_batch(texts) == demo_tok.sp.encode(texts)


def test_short_texts_and_long_batches_get_the_same_ids(demo_tok):
    from llmkit.chunk_cache import ChunkCacheEncoder

    texts = EDGE_CASES + demo_texts()[::50]
    batch = ChunkCacheEncoder(demo_tok.sp)
    assert [demo_tok.encode(t) for t in texts] == [batch.encode([t])[0].tolist()
                                                   for t in texts]


def test_literal_whitespace_mark_is_byte_encoded_to_survive_the_round_trip(demo_tok):
    ids = demo_tok.encode("a▁b")
    byte_ids = [demo_tok.piece_to_id(f"<0x{b:02X}>") for b in "▁".encode()]
    assert ids[1:4] == byte_ids or byte_ids == ids[ids.index(byte_ids[0]):][:3]
    assert demo_tok.sp.decode(demo_tok.sp.encode("a▁b")) == "a b"  # what we avoid
    assert demo_tok.decode(ids) == "a▁b"


def test_special_tokens_are_single_ids_never_split_or_merged(demo_tok):
    for role, token in ROLE_TOKENS.items():
        assert demo_tok.encode(token) == [demo_tok.role_ids[role]]
        ids = demo_tok.encode(f"x{token}y")
        assert demo_tok.role_ids[role] in ids and len(ids) == 3
    assert demo_tok.encode(END_OF_TURN) == [demo_tok.end_of_turn_id]
    specials = [*ROLE_TOKENS.values(), END_OF_TURN]
    pieces = [demo_tok.id_to_piece(i) for i in range(demo_tok.vocab_size)]
    assert not [p for p in pieces if p not in specials and any(s in p for s in specials)]
    # control tokens typed as text stay text: a document cannot forge </s>
    assert demo_tok.eos_id not in demo_tok.encode("</s>")


def test_chat_encoding_equals_the_template_and_masks_assistant_tokens(demo_tok):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "你好, what is 2+2?"},
            {"role": "assistant", "content": " 4\n"}]
    ids, mask = demo_tok.encode_chat(msgs)
    text = demo_tok.format_chat(msgs)
    assert text == ("<|system|>Be brief.<|end|><|user|>你好, what is 2+2?<|end|>"
                    "<|assistant|> 4\n<|end|>")
    assert ids == [demo_tok.bos_id] + demo_tok.encode(text)
    learned = [i for i, m in zip(ids, mask) if m]
    assert learned == demo_tok.encode(" 4\n") + [demo_tok.end_of_turn_id]
    prompt, pmask = demo_tok.encode_chat(msgs[:2], add_generation_prompt=True)
    assert prompt[-1] == demo_tok.role_ids["assistant"] and not any(pmask)
    assert demo_tok.stop_ids == [demo_tok.end_of_turn_id, demo_tok.eos_id]
    with pytest.raises(UserError, match="role must be one of"):
        demo_tok.encode_chat([{"role": "bot", "content": "x"}])


def test_jieba_hybrid_round_trips_and_no_piece_crosses_a_jieba_boundary(tmp_path):
    chinese = [t for t in demo_texts(skip_source="synthetic-noise") if "，" in t][:250]
    tok = build_tokenizer(tmp_path / "tok", chinese + EDGE_CASES + small_corpus(),
                          vocab_size=5000, jieba=True)
    texts = demo_texts() + EDGE_CASES
    encoded = tok.encode_batch(texts)
    assert [t[:40] for t, ids in zip(texts, encoded) if tok.decode(ids) != t] == []
    crossed = 0
    for text, ids in zip(chinese[:200], tok.encode_batch(chinese[:200])):
        ends, pos = set(), 0
        for i in ids:  # token boundaries as byte offsets
            p = tok.id_to_piece(i)
            pos += 1 if p.startswith("<0x") and len(p) == 6 else len(
                p.replace("▁", " ").encode())
            ends.add(pos)
        cuts = {len(text[:c].encode()) for c in jieba_boundaries(text)}
        crossed += len(cuts - ends)
    assert crossed == 0
    assert tok.config["jieba"] is True


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
