import pytest

from llmkit.data.arrow import string_buffers
from llmkit.data.dedup.shingles import (CHARS, WORDS, ShingleConfig, document_modes,
                                        shingle_hashes, verification_sets)
from llmkit.errors import ConfigError


def shingle_set(text, **cfg):
    return set(shingle_hashes([text], ShingleConfig(**cfg)).of(0).tolist())


def test_word_ngrams_ignore_case_punctuation_and_spacing_by_default():
    assert shingle_set("The cat, sat on\tthe  MAT!") == shingle_set("the cat sat on the mat")
    assert len(shingle_set("the cat sat on the mat")) == 4  # 6 words -> 4 word 3-grams


def test_case_and_punctuation_count_when_switched_off():
    assert shingle_set("The cat sat", lowercase=False) != shingle_set("the cat sat",
                                                                      lowercase=False)
    assert shingle_set("cat, sat on", strip_punctuation=False) != shingle_set(
        "cat sat on", strip_punctuation=False)


def test_word_order_matters_within_a_shingle():
    assert shingle_set("a b c d") != shingle_set("d c b a")


def test_chinese_is_shingled_by_characters_and_english_by_words():
    batch = shingle_hashes(["今天天气很好，我们去公园散步。", "the weather is nice today"],
                           ShingleConfig(word_ngram=3, char_ngram=3))
    assert batch.modes.tolist() == [CHARS, WORDS]
    assert len(batch.of(0)) == 13 - 2  # 13 Han characters, punctuation dropped
    assert len(batch.of(1)) == 5 - 2


def test_a_few_latin_words_in_chinese_text_stay_whole_tokens():
    data, offsets = string_buffers(["我们用Python写代码", "we write code in 中文"])
    assert document_modes(data, offsets, True, 0.5).tolist() == [CHARS, WORDS]
    # 我 们 用 python 写 代 码 = 7 tokens -> 5 character 3-grams
    assert len(shingle_hashes(["我们用Python写代码"], ShingleConfig()).of(0)) == 5


def test_short_and_empty_documents():
    batch = shingle_hashes(["two words", "", "   ...  "], ShingleConfig(word_ngram=3))
    assert [len(batch.of(i)) for i in range(3)] == [1, 0, 0]


def test_jieba_segments_chinese_documents_into_words():
    batch = shingle_hashes(["我们今天去公园散步然后回家吃饭", "plain english words here"],
                           ShingleConfig(cjk_tokens="jieba", word_ngram=2))
    chars = shingle_hashes(["我们今天去公园散步然后回家吃饭"], ShingleConfig(char_ngram=2))
    assert batch.modes.tolist() == [CHARS, WORDS]
    assert 0 < len(batch.of(0)) < len(chars.of(0))  # fewer word bigrams than char bigrams


def test_verification_sets_are_32_bit_cuts_of_the_shingle_hashes():
    batch = shingle_hashes(["a b c d e", "x y z"], ShingleConfig())
    values, lengths = verification_sets(batch)
    assert lengths.tolist() == [3, 1]
    assert values.tolist() == (batch.hashes & 0xFFFFFFFF).tolist()


@pytest.mark.parametrize("bad", [{"word_ngram": 0}, {"cjk_ratio": 2.0}, {"cjk_tokens": "x"}])
def test_invalid_config_is_rejected(bad):
    with pytest.raises(ConfigError):
        ShingleConfig(**bad)


def test_non_ascii_text_is_lowered_like_ascii():
    assert shingle_set("ÉCOLE Über Straße") == shingle_set("école über straße")
    assert shingle_set("ABC def GHI") == shingle_set("abc DEF ghi")
    assert shingle_set("ABC def GHI", lowercase=False) != shingle_set("abc DEF ghi",
                                                                      lowercase=False)
