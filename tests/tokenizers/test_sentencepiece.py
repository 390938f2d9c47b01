import gzip
import json
import random
from pathlib import Path

import pytest

from llmkit.tokenizers.cjk import jieba_boundaries
from llmkit.errors import UserError
from llmkit.tokenizers.sentencepiece import END_OF_TURN, ROLE_TOKENS, Tokenizer
from llmkit.data.tokenizer_training import (TokenizerConfig, split_sentences, tokenizer_config_json,
                                       train_sentencepiece)

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "data" / "raw"

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
    from llmkit.tokenizers.chunk_cache import ChunkCacheEncoder

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
