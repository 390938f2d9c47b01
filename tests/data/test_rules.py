"""Each quality rule removes its bad document with its own name and keeps good English and
Chinese text; rules are switched and tuned through CleanConfig."""

import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from llmkit.tokenizers import cjk
from llmkit.tokenizers.cjk import COMMON_HAN
from llmkit.data import document, rules
from llmkit.data.clean import CleanConfig, clean_batch, clean_text
from llmkit.data.document import Doc
from llmkit.data.rule_state import rule_state
from llmkit.data.rules import RULE_NAMES, RULES, first_failed_rule
from llmkit.errors import ConfigError

CFG = CleanConfig()

GOOD_EN = (
    "The river town wakes slowly in winter. Before the sun is up, the baker has already "
    "lit his oven, and the smell of bread drifts down to the water where the ferrymen wait. "
    "Children walk to school in pairs, their breath hanging in the cold air, while their "
    "parents open the shutters of small shops that have stood on the same street for a "
    "hundred years.\n\n"
    "By noon the market is full of farmers who have come across the bridge with apples, "
    "cheese and firewood. Nobody is in a hurry, and that is exactly why visitors keep coming "
    "back to it."
)
# Real text from the demo corpus: a Tang poem (张九龄《感遇》) and modern prose (Debian's code
# of conduct, which mixes in Latin words).
GOOD_ZH_POEM = (
    "《感遇・其一》\n作者：张九龄\n兰叶春葳蕤，桂华秋皎洁。\n欣欣此生意，自尔为佳节。\n"
    "谁知林栖者，闻风坐相悦。\n草木有本心，何求美人折？"
)
GOOD_ZH_PROSE = (
    "保持合作\n\nDebian 是一个庞大而复杂的项目，这里永远会有需要学习的新知识。\n"
    "当你需要帮助的时候，主动向他人求助是一个好的选择。类似地，\n"
    "他人所提供的帮助应该放在改进 Debian 这一共同目标的上下文中理解。\n"
    "当你做了有益于项目的事情时，也请不要吝啬向他人解释其原理，这样\n"
    "他人才能够基于你的工作做出进一步的改进。\n\n    -- Debian 《行为准则》第三条"
)
GOOD = {"en": GOOD_EN, "zh_poem": GOOD_ZH_POEM, "zh_prose": GOOD_ZH_PROSE}

RARE_HAN = "".join(chr(c) for c in range(0x9F00, 0x9F80) if chr(c) not in COMMON_HAN)
VARIED = " ".join(f"alpha{i} beta{i} gamma{i}" for i in range(30))  # 90 distinct words


def doc(text, cfg=CFG, **kw):
    return Doc(text, rule_state(cfg), **kw)


# (rule, language, text that rule alone must reject, config overrides)
BAD = [
    ("c4_lorem_ipsum", "en", GOOD_EN + "\nLorem ipsum dolor sit amet, consectetur.", {}),
    ("gopher_min_words", "en", "Click here to read more.", {}),
    ("gopher_min_words", "zh", "加载中，请稍候", {}),
    ("gopher_max_words", "en", GOOD_EN, {"max_words": 60}),
    ("gopher_max_words", "zh", GOOD_ZH_PROSE, {"max_words": 100}),
    ("gopher_mean_word_length", "en", " ".join(["internationalisations"] * 60), {}),
    ("gopher_mean_word_length", "en", " ".join(["a", "of"] * 40), {}),
    ("gopher_symbol_ratio", "en", " ".join(f"#tag{i}" for i in range(60)), {}),
    ("gopher_symbol_ratio", "zh", "好的……" * 30, {}),
    ("gopher_bullet_lines", "en", "\n".join(f"- item number {i}" for i in range(20)), {}),
    ("gopher_bullet_lines", "zh", "\n".join(f"• 第{i}项内容说明" for i in range(20)), {}),
    ("gopher_ellipsis_lines", "en", "\n".join(f"Read the story {i}..." for i in range(9)), {}),
    ("gopher_ellipsis_lines", "zh", "\n".join(f"第{i}章 他走进了房间……" for i in range(9)), {}),
    ("gopher_alpha_words", "en", " ".join(str(i * 37) for i in range(80)) + " total", {}),
    ("gopher_alpha_words", "zh", "编号 " + " ".join(str(i * 37) for i in range(80)), {}),
    ("gopher_stop_words", "en", VARIED, {}),
    ("cjk_common_chars", "zh", "，".join(RARE_HAN[i:i + 6] for i in range(0, 96, 6)) + "。", {}),
    ("gopher_dup_lines", "en", "\n".join(["Buy now and save."] * 5 + ["Call us today."] * 5), {}),
    ("gopher_dup_lines", "zh", "\n".join(["限时优惠，立即购买。"] * 5 + ["欢迎来电咨询。"] * 5), {}),
    ("gopher_dup_paragraphs", "en", "\n\n".join(["Buy now."] * 4 + ["Call us."] * 4), {}),
    ("gopher_dup_paragraphs", "zh", "\n\n".join(["立即购买。"] * 4 + ["欢迎来电。"] * 4), {}),
    ("gopher_dup_line_chars", "en", "\n".join(["a", "b", "c", "d", GOOD_EN[:300], GOOD_EN[:300]]), {}),
    ("gopher_dup_line_chars", "zh",
     "\n".join(["一", "二", "三", "四", GOOD_ZH_PROSE[:60], GOOD_ZH_PROSE[:60]]), {}),
    ("gopher_dup_paragraph_chars", "en", "\n\n".join(["a", "b", "c", "d", GOOD_EN, GOOD_EN]), {}),
    ("gopher_dup_paragraph_chars", "zh",
     "\n\n".join(["一", "二", "三", "四", GOOD_ZH_PROSE, GOOD_ZH_PROSE]), {}),
    ("gopher_top_ngrams", "en", " ".join(f"word{i} cheap shoes" for i in range(40)), {}),
    ("gopher_top_ngrams", "zh", "".join(f"{c}便宜鞋子" for c in RARE_HAN[:60]), {}),
    ("gopher_dup_ngrams", "en", GOOD_EN + " " + GOOD_EN, {}),
    ("gopher_dup_ngrams", "zh", GOOD_ZH_PROSE + GOOD_ZH_PROSE, {}),
    ("fineweb_line_punctuation", "en", "\n".join(f"Menu entry {i}" for i in range(20)), {}),
    ("fineweb_line_punctuation", "zh", "\n".join(f"产品中心 第{i}页" for i in range(20)), {}),
]


@pytest.mark.parametrize("name,lang,text,overrides", BAD, ids=[f"{b[0]}-{b[1]}" for b in BAD])
def test_rule_rejects_its_bad_document_with_its_own_name(name, lang, text, overrides):
    cfg = CleanConfig(**overrides)
    rule = getattr(rules, name)
    assert rule(doc(text, cfg), cfg) == name


@pytest.mark.parametrize("rule", RULES, ids=RULE_NAMES)
@pytest.mark.parametrize("kind", list(GOOD))
def test_every_rule_keeps_good_english_and_chinese(rule, kind):
    assert rule(doc(GOOD[kind]), CFG) is None


def test_boilerplate_lines_names_documents_that_were_nothing_but_chrome():
    assert rules.boilerplate_lines(doc("", dropped_lines=3), CFG) == "boilerplate_lines"
    assert rules.boilerplate_lines(doc(GOOD_EN, dropped_lines=2), CFG) is None
    page = ("Home | About Us | Products | Contact\n"
            "We use cookies to improve your experience. Read our Cookie Policy.")
    assert clean_text(page, CFG)[1] == "boilerplate_lines"
    page_zh = "首页 | 新闻中心 | 关于我们 | 联系我们\n版权所有 © 2020 某某有限公司 京ICP备12345678号"
    assert clean_text(page_zh, CFG)[1] == "boilerplate_lines"


def test_chinese_documents_count_a_character_as_a_word():
    d = doc("在 Debian 中，我们合作。")
    assert d.is_cjk
    assert d.words == ["在", "Debian", "中", "，", "我", "们", "合", "作", "。"]
    assert d.content_words == 7
    assert not doc(GOOD_EN).is_cjk


def test_jieba_segmentation_counts_real_words():
    cfg = CleanConfig(cjk_words="jieba")
    d = doc("我们在图书馆学习。", cfg)
    assert d.is_cjk
    assert "图书馆" in d.words and d.content_words < 8
    saying = "吃不言，睡不语。\n    --《谚语》"  # the minimum length stays in characters
    assert rules.gopher_min_words(doc(saying, cfg), cfg) is None


def test_chinese_minimum_length_is_in_characters_not_gopher_words():
    saying = "吃不言，睡不语。\n    --《谚语》"  # 8 CJK characters: a complete document
    assert rules.gopher_min_words(doc(saying), CFG) is None
    assert rules.gopher_min_words(doc(saying), CleanConfig(cjk_min_words=9)) == "gopher_min_words"


def test_refrains_in_short_classical_text_are_not_spam():
    chant = ("南有樛木，葛藟纍之，樂只君子，福履綏之。\n南有樛木，葛藟荒之，樂只君子，福履將之。\n"
             "南有樛木，葛藟縈之，樂只君子，福履成之。")
    assert first_failed_rule(doc(chant), CFG) is None


def test_first_failure_wins_and_disabled_rules_are_skipped():
    text = "Lorem ipsum."  # both a placeholder and too short
    assert first_failed_rule(doc(text), CFG) == "c4_lorem_ipsum"
    cfg = CleanConfig(disabled_rules=["c4_lorem_ipsum"])
    assert clean_text(text, cfg)[1] == "gopher_min_words"
    everything_off = CleanConfig(disabled_rules=list(RULE_NAMES))
    assert clean_text(text, everything_off)[1] is None


def test_config_rejects_unknown_rules_and_bad_thresholds():
    with pytest.raises(ConfigError, match="did you mean 'gopher_min_words'"):
        CleanConfig(disabled_rules=["gopher_min_word"])
    with pytest.raises(ConfigError, match="max_dup_lines"):
        CleanConfig(max_dup_lines=1.5)
    with pytest.raises(ConfigError, match="max_top_ngram_chars"):
        CleanConfig(max_top_ngram_chars=[0.2, -1.0])
    with pytest.raises(ConfigError, match="min_mean_word_length"):
        CleanConfig(min_mean_word_length=12)


@pytest.mark.parametrize("text", [
    GOOD_EN, GOOD_ZH_POEM, GOOD_ZH_PROSE, "", "  \n ", "a\u3000b\xa0c\u2003d 𠀀𠀁x",
    "ab，“cd” ef -- | 42 x_1 _ 3.14 Привет — 😀 𝐀bc"])
def test_compiled_word_pass_agrees_with_python_string_methods(text):
    d = doc(text)
    hashes, lengths, counts = document.word_stats(text, rule_state(CFG).stop_hashes)  # the compiled pass
    words = d.words
    assert lengths.tolist() == [len(w) for w in words]
    assert hashes.tolist() == [document.word_hash(w) for w in words]
    symbols = [w for w in words if not any(c.isalnum() or c == "_" for c in w)]
    assert counts == document.WordCounts(
        words=len(words), symbol_words=len(symbols), symbol_chars=sum(map(len, symbols)),
        letterless_words=sum(not any(c.isalpha() for c in w) for w in words),
        cjk_chars=len(cjk.CJK_CHAR.findall(text)), word_chars=sum(map(len, words)),
        content_words_by_char=len(words) - len(symbols),
        han_chars=len(cjk.HAN_CHAR.findall(text)),
        common_han_chars=sum(c in COMMON_HAN for c in cjk.HAN_CHAR.findall(text)),
        stop_words=len(set(CFG.stop_words) & set(words)))


def python_layout(text):
    """Layout as the rules took it with str methods before the compiled pass did."""
    lines = [line for line in text.split("\n") if line]
    paragraphs = [p for p in text.split("\n\n") if p]

    def repeats(items):
        counts = Counter(items)
        return sum(n - 1 for n in counts.values()), sum(len(i) * (n - 1) for i, n in counts.items())

    return document.Layout(
        len(lines), sum(line.lstrip().startswith(document.BULLETS) for line in lines),
        sum(line.endswith(document.ELLIPSES) for line in lines),
        sum(line.endswith(document.TERMINAL_PUNCTUATION) for line in lines), *repeats(lines),
        len(paragraphs), *repeats(paragraphs), text.count("#"), text.count("...") + text.count("…"))


PIECES = ["a", "b", "ab", "的", "，", " ", "  ", "\u3000", "\t", "\n", "\n", "\n\n", "\n\n\n", ".", "..",
          "...", "…", "#", "- ", " • x", "*", "。", "！", "”", "x.", "ab\n", "\nab"]


def random_texts(count, seed=0):
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randrange(30))) for _ in range(count)]


@pytest.mark.parametrize("text", [
    GOOD_EN, GOOD_ZH_POEM, GOOD_ZH_PROSE, "", "\n", "\n\n", "a\n\n\nb", "a\n\n\n\nb\n\na\n\n\nb",
    "x\ny\nx\n\nx\ny\nx", "....... … ..# ## ...\n...", "  - one\n\u3000• two\n   \n*\n-", "ab", "ab\n"])
def test_compiled_layout_agrees_with_python_string_methods(text):
    assert doc(text).layout == python_layout(text)


def test_compiled_layout_agrees_with_python_string_methods_on_random_texts():
    texts = random_texts(3000)
    for text, row in zip(texts, document.measure_texts(texts, rule_state(CFG))):
        assert doc(text, measured=row).layout == python_layout(text), repr(text)


def per_text_ngram_stats(d, cfg=CFG):
    """Doc.ngram_stats as it was taken before the batch pass: word_stats, then
    repetition_stats with the document's n sizes."""
    scale = cfg.cjk_ngram_scale if d.is_cjk else 1.0
    top_ns, dup_ns = document._ngram_sizes(len(cfg.max_top_ngram_chars), len(cfg.max_dup_ngram_chars),
                                        scale)
    hashes, lengths, counts = document.word_stats(d.text, rule_state(cfg).stop_hashes)
    if counts.words < cfg.ngram_min_words * scale:
        return [0] * len(top_ns), [0] * len(dup_ns), 0
    top, dup = document.repetition_stats(hashes, lengths, top_ns, dup_ns)
    return [top[n] for n in top_ns], [dup[n] for n in dup_ns], counts.word_chars


def test_the_batch_pass_takes_the_ngram_stats_the_per_text_passes_take():
    texts = [GOOD_EN + " " + GOOD_EN, GOOD_ZH_PROSE * 3, GOOD_ZH_POEM * 4, VARIED + " " + VARIED[:200],
             " ".join(f"word{i} cheap shoes" for i in range(40)), "short text", ""]
    texts += [" ".join(["the river"] * n + GOOD_EN.split()[:k]) for n in (3, 10, 30) for k in (20, 45, 80)]
    for text, row in zip(texts, document.measure_texts(texts, rule_state(CFG))):
        d = doc(text, measured=row)
        assert d.ngram_stats == per_text_ngram_stats(d), text[:40]


def test_ngram_stats_of_a_document_over_max_words_are_taken_when_a_rule_asks():
    cfg = CleanConfig(max_words=100, disabled_rules=["gopher_max_words"])
    for text in (GOOD_EN + " " + GOOD_EN, GOOD_ZH_PROSE * 3):
        d = doc(text, cfg)
        assert d._ngram_row[0] == -1  # not taken by the compiled pass
        assert d.ngram_stats == per_text_ngram_stats(d, cfg) and d.ngram_stats[2] > 0
        assert rules.gopher_dup_ngrams(d, cfg) == "gopher_dup_ngrams"


def repetition(text):
    words = text.split()
    hashes = np.array([hash(w) for w in words], np.int64).view(np.uint64)
    return document.repetition_stats(hashes, np.array([len(w) for w in words]), np.array([2, 3]),
                                  np.array([5, 6]))


def test_repetition_stats_match_a_direct_count():
    top, dup = repetition("a b c a b c a b x")
    assert top[2] == 3 * 2  # "a b" three times, 2 characters each
    assert top[3] == 2 * 3  # "a b c" twice
    assert dup[5] == 5  # "a b c a b" again at word 3
    assert dup[6] == 0
    top, dup = repetition("one two three four five one two three four five")
    assert dup[5] == len("onetwothreefourfive")  # the copy, not the original
    assert dup[6] == 0
    top, dup = repetition("x a b c d e f a b c d e f")  # two overlapping repeated 5-grams
    assert dup[5] == dup[6] == 6


def test_an_extension_b_character_is_han_for_the_rules():
    text = "𠀀𠀁 中文"  # U+20000 and U+20001: CJK Extension B
    for cfg in (CFG, CleanConfig(cjk_words="jieba")):
        counts = doc(text, cfg).counts
        assert (counts.han_chars, counts.cjk_chars) == (4, 4)


# ---------------------------------------------------------------- row rules: url


def test_a_url_on_the_block_list_removes_its_row_by_domain_subdomain_or_substring(tmp_path):
    blocklist = tmp_path / "blocked.txt"
    blocklist.write_text("# ad servers\nads.example.com\n*.spam.net\nutm_source=  # trackers\n\n")
    urls = ["https://ads.example.com/x", "https://cdn.ads.example.com/y", "https://example.com/ok",
            "http://a.spam.net/", "https://b.org/?utm_source=mail", None, "http://[::1"]
    table = pa.table({"id": [str(i) for i in range(len(urls))], "source": ["s"] * len(urls),
                      "text": ["Some text."] * len(urls), "url": urls})
    cfg = CleanConfig(url_blocklist=str(blocklist), disabled_rules=list(RULE_NAMES))
    kept, removed = clean_batch(table, cfg)
    assert kept.column("url").to_pylist() == ["https://example.com/ok", None, "http://[::1"]
    assert removed.column("reason").to_pylist() == ["url"] * 4


def test_a_block_list_that_cannot_be_read_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=f"clean.url_blocklist: cannot read {tmp_path}/no.txt"):
        CleanConfig(url_blocklist=str(tmp_path / "no.txt"))
