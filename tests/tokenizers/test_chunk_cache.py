import numpy as np
import pytest

import llmkit.tokenizers.chunk_cache as C
from llmkit.core import aot
from llmkit.tokenizers.chunk_cache import ChunkCacheEncoder
from llmkit.tokenizers.cjk import jieba_boundaries
from tests.tokenizers.test_sentencepiece import EDGE_CASES, build_tokenizer, demo_texts, small_corpus


@pytest.fixture(scope="module")
def demo_tok(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"), demo_texts() + EDGE_CASES,
                           vocab_size=8000)


@pytest.fixture(scope="module")
def texts():
    return demo_texts()[::7] + EDGE_CASES


def flat(encoded):
    return [i for ids in encoded for i in ids]


def test_cold_and_warm_cache_give_sentencepieces_ids(demo_tok, texts):
    plain = [t for t in texts if "▁" not in t]  # sentencepiece decodes a literal ▁ as a space
    want = demo_tok.sp.encode(plain)
    enc = ChunkCacheEncoder(demo_tok.sp)
    first, counts = enc.encode(plain)
    assert enc.cached_chunks > 1000
    again, _ = enc.encode(plain)  # every chunk now a hit
    assert first.tolist() == again.tolist() == flat(want)
    assert counts.tolist() == [len(ids) for ids in want]


def test_ids_do_not_depend_on_table_size_hash_collisions_or_memory_bounds(
        demo_tok, texts, monkeypatch):
    want = ChunkCacheEncoder(demo_tok.sp).encode(texts)[0].tolist()
    # a table of 4 slots that never grows: chunks it has no room for are encoded, not kept
    monkeypatch.setattr(C, "_MIN_TABLE_BITS", 2)
    monkeypatch.setattr(C, "_MAX_TABLE_BITS", 2)
    tiny = ChunkCacheEncoder(demo_tok.sp)
    assert flat(tiny.encode([t])[0].tolist() for t in texts) == want
    # every chunk hashes alike: a hit must still have the same bytes
    monkeypatch.setattr(C, "_MAX_TABLE_BITS", 12)
    clash = ChunkCacheEncoder(demo_tok.sp, hash_mask=0)
    assert flat(clash.encode(texts[i:i + 50])[0].tolist()
                for i in range(0, len(texts), 50)) == want
    # long chunks' bytes overflow their store: the cache starts over, again and again
    monkeypatch.setattr(C, "_KEPT_BYTES", 64)
    small = ChunkCacheEncoder(demo_tok.sp)
    assert flat(small.encode(texts[i:i + 20])[0].tolist()
                for i in range(0, len(texts), 20)) == want


def test_the_table_grows_and_keeps_what_it_held(demo_tok, texts, monkeypatch):
    # it grows between documents: short ones, so that none fills the 128 chunks it starts with
    texts = [t[:200] for t in texts]
    monkeypatch.setattr(C, "_MIN_TABLE_BITS", 8)
    enc = ChunkCacheEncoder(demo_tok.sp)

    slots = len(enc._table)
    for i in range(0, len(texts), 100):
        enc.encode(texts[i:i + 100])
    assert len(enc._table) > slots
    calls = []
    encode = enc._sp.encode
    enc._sp = type("Spy", (), {"encode": lambda self, *a, **k: calls.append(a) or
                               encode(*a, **k)})()
    enc.encode(texts[:300])
    assert calls == []  # every chunk was still there


def test_separated_and_one_by_one_miss_encodings_agree(demo_tok, texts):
    joined = ChunkCacheEncoder(demo_tok.sp)
    assert joined._join_misses
    one_by_one = ChunkCacheEncoder(demo_tok.sp)
    one_by_one._join_misses = False
    assert joined.encode(texts)[0].tolist() == one_by_one.encode(texts)[0].tolist()


def test_utf8_input_with_an_end_id_after_each_text(demo_tok, texts):
    enc = ChunkCacheEncoder(demo_tok.sp)
    want = [ids + [2] for ids in demo_tok.encode_batch(texts)]
    data = [t.encode() for t in texts]
    ids, counts = enc.encode_utf8(b"".join(data), np.cumsum([len(d) for d in data]), end_id=2)
    assert ids.tolist() == flat(want)
    assert counts.tolist() == [len(w) for w in want]
    with pytest.raises(ValueError, match="end at byte"):
        enc.encode_utf8(b"abc", [2])


def test_jieba_mode_encodes_each_jieba_word_as_sentencepiece_does(tmp_path):
    chinese = [t for t in demo_texts(skip_source="synthetic-noise") if "，" in t][:120]
    tok = build_tokenizer(tmp_path / "tok", chinese + small_corpus(), vocab_size=3000,
                          jieba=True)
    # the last one holds a CJK Extension B character (U+20000) inside a Han run
    texts = [t for t in chinese + small_corpus() if "▁" not in t] + ["你好𠀀世界，𠀁中文"]
    want = []
    for t in texts:
        bounds = [0, *jieba_boundaries(t), len(t)]
        want.append(flat(tok.sp.encode([t[a:b] for a, b in zip(bounds, bounds[1:])])))
    enc = ChunkCacheEncoder(tok.sp, jieba=True)
    assert enc.encode(texts)[0].tolist() == flat(want)
    data = [t.encode() for t in texts]
    ids, _ = ChunkCacheEncoder(tok.sp, jieba=True).encode_utf8(
        b"".join(data), np.cumsum([len(d) for d in data]))
    assert ids.tolist() == flat(want)


def test_siblings_share_what_sentencepiece_encoded_not_their_tables(demo_tok, texts):
    first = ChunkCacheEncoder(demo_tok.sp)
    second = first.sibling()
    want = first.encode(texts)[0].tolist()
    assert second.cached_chunks == 0 and first.cached_chunks > 0

    calls = []
    encode = second._sp.encode
    second._sp = type("Spy", (), {"encode": lambda self, *a, **k: calls.append(a) or
                                  encode(*a, **k)})()
    assert second.encode(texts)[0].tolist() == want
    assert calls == []  # every new chunk's ids came from the first encoder
    assert second.cached_chunks == first.cached_chunks


def test_the_jit_fallback_gives_the_same_ids(demo_tok, texts, monkeypatch):
    ahead_of_time = C.kernels()
    want = ChunkCacheEncoder(demo_tok.sp).encode(texts)[0].tolist()
    monkeypatch.setattr(C, "_KERNELS", aot.just_in_time(C.KERNEL_MODULE, C._first_call))  # no C compiler
    assert C.kernels() is not ahead_of_time
    assert ChunkCacheEncoder(demo_tok.sp).encode(texts)[0].tolist() == want
