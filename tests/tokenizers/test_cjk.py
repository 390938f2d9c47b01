"""One definition of Han for the tokenizer, the chunk cache and the rules; jieba's cuts; the
script label."""

from llmkit.tokenizers.cjk import (CJK_CHAR, HAN_CHAR, HAN_RUN, count_words, jieba_boundaries,
                        jieba_words, language_of, mark_jieba_boundaries)

EXT_B = "𠀀"  # U+20000, the first character of CJK Extension B


def test_an_extension_b_character_is_han_for_the_tokenizers_pre_segmentation():
    assert HAN_CHAR.fullmatch(EXT_B) and CJK_CHAR.fullmatch(EXT_B)
    text = f"你好{EXT_B}世界"
    assert HAN_RUN.findall(text) == [text]  # one Han run, not two around a stranger
    assert jieba_boundaries(text) == [2, 3]  # jieba makes the character a word of its own
    assert mark_jieba_boundaries(text, "\t") == f"你好\t{EXT_B}\t世界"
    assert language_of(EXT_B * 10) == "zh"


def test_jieba_boundaries_fall_inside_han_runs_only():
    text = "我们在北京 hello 天安门"
    cuts = jieba_boundaries(text)
    assert cuts and all(HAN_CHAR.match(text[c - 1]) and HAN_CHAR.match(text[c]) for c in cuts)
    assert jieba_boundaries("中") == [] and jieba_boundaries("plain text") == []


def test_jieba_words_leave_whitespace_out_and_keep_the_text():
    text = "我们在北京 天安门\n hello"
    words = jieba_words(text)
    assert not any(w.isspace() for w in words)
    assert "".join(words) == "".join(text.split())


def test_language_of_and_count_words():
    assert language_of("The river town wakes slowly.") == "latin"
    assert language_of("1234 -- 5678") == "other"
    assert language_of("床前明月光，疑是地上霜。") == "zh"
    assert language_of("Привет, как дела?") == "other"
    assert count_words("the river, the town", "latin") == 4
    assert count_words("我们在北京。", "zh") == 3  # 我们 / 在 / 北京; the full stop is no word
