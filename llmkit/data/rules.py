"""Document quality rules (Gopher, C4, FineWeb) as small functions.

A rule is `rule(doc, cfg) -> str | None`: None keeps the document, a string is the reason it is
removed, and the reason is always the rule's own name, so the manifest counts removals per rule
and `disabled_rules` switches rules off by the same name. `RULES` is the order they run in
(cheap, decisive checks first); the first rule that objects decides the reason.

Words. Text in Chinese or Japanese has no spaces, so counting whitespace-separated words would
make a whole paragraph one "word". Here every CJK character (Han, kana) is one word and the rest
of the text is split on whitespace, so "在 Debian 中" has 3 words; with `cjk_words="jieba"` the
n-gram rules see CJK text segmented into real words instead (slower). A document is CJK when
CJK characters make up at least `cjk_min_fraction` of its words. CJK documents get their own
minimum length (`cjk_min_words` characters: the shortest real texts, proverbs of 6-8
characters, are documents; Gopher's 50 words would kill most quatrains), skip the
mean-word-length rule (a character-word is 1 long by definition), check common characters
instead of English stop words, and take Gopher's n-gram sizes in characters times
`cjk_ngram_scale` (a Chinese word is about two characters; a word 5-gram is a 10-character
n-gram).

Speed. The rules share one `Doc`, whose measurements are computed once, on first use. Word
counts, symbol and letter counts and the word hashes for the n-gram rules come from one
compiled pass over the text's code points, and the n-gram statistics from a second one
(llmkit.data._rule_kernels, compiled ahead of time: see llmkit.aot); everything else is `str`
methods and a few regular expressions that open with a character class or a literal, so that
`re` can skip ahead.

Thresholds are the published ones unless a field's comment in `CleanConfig` says otherwise:
Gopher = Rae et al. 2021, "Scaling Language Models", appendix A; C4 = Raffel et al. 2020;
FineWeb = Penedo et al. 2024 (datatrove's FineWebQualityFilter).
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import repeat
from typing import NamedTuple

import numpy as np

from llmkit import aot
from llmkit.cjk import (CJK_CHAR, CJK_CLASS, CJK_RANGES, COMMON_HAN, HAN_CHAR, HAN_RANGES,
                        jieba_words)

_TOKEN = re.compile(f"[{CJK_CLASS}]|[^\\s{CJK_CLASS}]+")  # Doc.words of CJK text
# Symbol words (no letter, digit or "_") of CJK text in " " + text + " ", for jieba's case
# (the compiled pass counts them otherwise).
_CJK_SYMBOL_WORD = re.compile(f"[^\\w\\s](?<=[\\s{CJK_CLASS}].)[^\\w\\s]*(?=[\\s{CJK_CLASS}])")
_HAS_WORD_CHAR = re.compile(r"\w")
_LETTER = re.compile(r"[^\W\d_]")

GOPHER_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
BULLETS = ("•", "‣", "●", "○", "◦", "▪", "■", "□", "-", "*", "·", "–")
ELLIPSES = ("...", "…")
# C4's end-of-sentence marks plus closing quotes and brackets after them, and the Chinese
# comma: a line of verse ends with "，" when its couplet continues on the next line.
TERMINAL_PUNCTUATION = (".", "!", "?", "…", '"', "'", "”", "’", ")", "。", "！", "？", "；",
                        "」", "』", "）", "】", "》", "，")


class _once:
    """A property computed on first use and then stored on the instance.

    functools.cached_property does the same but takes a lock on every first access (3.11),
    which costs more than most of the measurements here.
    """

    def __init__(self, fn):
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


class Doc:
    """One normalised document and the measurements rules share, each computed at most once."""

    def __init__(self, text: str, cfg, *, dropped_lines: int = 0):
        self.text = text
        self.cfg = cfg
        self.dropped_lines = dropped_lines  # boilerplate lines removed before the rules ran

    @_once
    def jieba(self) -> bool:
        return self.cfg.cjk_words == "jieba" and not self.text.isascii() and \
            CJK_CHAR.search(self.text) is not None

    @_once
    def words(self) -> list[str]:
        if self.jieba:
            return jieba_words(self.text)
        if self.text.isascii() or not CJK_CHAR.search(self.text):
            return self.text.split()
        return _TOKEN.findall(self.text)

    @_once
    def counts(self) -> "WordCounts":
        """Word counts from one compiled pass over the text (or from jieba's words); the pass
        also leaves each word's hash and length in `word_hashes`, `word_lengths`."""
        if self.jieba:
            self.word_hashes, self.word_lengths, counts = _counts_of_words(self.text, self.words, self.cfg)
            return counts
        self.word_hashes, self.word_lengths, counts = word_stats(self.text, self.cfg._stop_hashes)
        return counts

    @property
    def cjk_chars(self) -> int:
        return self.counts.cjk_chars

    @property
    def content_words(self) -> int:
        """Gopher's word count: words that are not just punctuation or symbols."""
        return self.counts.words - self.counts.symbol_words

    @_once
    def is_cjk(self) -> bool:
        """CJK characters are at least `cjk_min_fraction` of the words (one per character)."""
        c = self.counts
        if not c.cjk_chars:
            return False
        other = c.content_words_by_char - c.cjk_chars
        return c.cjk_chars >= self.cfg.cjk_min_fraction * (c.cjk_chars + other)

    @_once
    def lines(self) -> list[str]:
        """Non-empty lines (normalisation has already stripped trailing whitespace)."""
        return [line for line in self.text.split("\n") if line]

    @_once
    def paragraphs(self) -> list[str]:
        return [p for p in self.text.split("\n\n") if p]

    @_once
    def line_repeats(self) -> tuple[int, int]:
        return _duplicates(self.lines)

    @_once
    def paragraph_repeats(self) -> tuple[int, int]:
        return _duplicates(self.paragraphs)

    @_once
    def ngram_scale(self) -> float:
        """How many of this document's words make one word of Gopher's n-grams."""
        return self.cfg.cjk_ngram_scale if self.is_cjk and not self.jieba else 1.0

    @_once
    def ngram_stats(self):
        """(top n-gram chars by n, repeated n-gram chars by n, total word chars, n scale).

        Documents shorter than `ngram_min_words` (scaled) get all zeros: in a short text one
        echoed phrase is a large fraction, and that is style (a refrain, a couplet), not spam.
        """
        scale, cfg = self.ngram_scale, self.cfg
        top_ns, dup_ns = _ngram_sizes(len(cfg.max_top_ngram_chars), len(cfg.max_dup_ngram_chars),
                                      scale)
        if self.counts.words < cfg.ngram_min_words * scale:
            size = max(top_ns[-1], dup_ns[-1]) + 1
            return [0] * size, [0] * size, 0, scale
        top, dup = repetition_stats(self.word_hashes, self.word_lengths, top_ns, dup_ns)
        return top, dup, self.counts.word_chars, scale


class WordCounts(NamedTuple):
    words: int  # as `Doc.words` cuts them
    symbol_words: int  # words without a letter, digit or "_": "|", "--", "，"
    symbol_chars: int
    letterless_words: int  # words without a letter (CJK characters are letters), symbols included
    cjk_chars: int
    word_chars: int  # characters in words: all but whitespace
    content_words_by_char: int  # non-symbol words when every CJK character is a word
    han_chars: int
    common_han_chars: int  # of them in COMMON_HAN
    stop_words: int  # distinct words of cfg.stop_words present


def _counts_of_words(text: str, words: list[str], cfg):
    """The compiled pass's results, for words cut by jieba."""
    symbols = [w for w in words if not _HAS_WORD_CHAR.search(w)]
    cjk = CJK_CHAR.subn("", text)[1]
    by_char = len(_TOKEN.findall(text)) - len(_CJK_SYMBOL_WORD.findall(f" {text} "))
    han = HAN_CHAR.findall(text)
    counts = WordCounts(len(words), len(symbols), sum(map(len, symbols)),
                        sum(not _LETTER.search(w) for w in words), cjk, sum(map(len, words)),
                        by_char, len(han), sum(map(COMMON_HAN.__contains__, han)),
                        len(cfg._stop_words.intersection(words)))
    # Python's string hash is salted per process, but only equality within a document
    # matters, so every worker gets the same result (barring a 2**-64 collision).
    hashes = np.fromiter(map(hash, words), np.int64, len(words)).view(np.uint64)
    return hashes, np.fromiter(map(len, words), np.int64, len(words)), counts


_NGRAM_SIZES: dict = {}


def _ngram_sizes(n_top: int, n_dup: int, scale: float):
    """The n of each top n-gram limit (2, 3, …) and repeated n-gram limit (5, 6, …), scaled."""
    key = (n_top, n_dup, scale)
    if key not in _NGRAM_SIZES:
        top = [round(n * scale) for n in range(2, 2 + n_top)] or [0]
        dup = [round(n * scale) for n in range(5, 5 + n_dup)] or [0]
        _NGRAM_SIZES[key] = (np.array(top, np.int64), np.array(dup, np.int64))
    return _NGRAM_SIZES[key]


SPACE, CJK, WORD, LETTER, HAN, COMMON = 1, 2, 4, 8, 16, 32  # bits of a character's class


def word_hash(word: str) -> int:
    """The hash `word_stats` gives a word (FNV-1a over its code points, unsalted)."""
    h = 14695981039346656037
    for c in word:
        h = ((h ^ ord(c)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


_CLASSES = None


def _char_classes():
    """The class bits of every code point (WORD and LETTER as Python's str methods say)."""
    global _CLASSES
    if _CLASSES is None:
        points = np.arange(0x110000, dtype=np.uint32)
        points[0xD800:0xE000] = ord("-")  # lone surrogates: numpy cannot hold them
        chars = points.view("U1")
        table = np.where(np.char.isspace(chars), SPACE, 0).astype(np.uint8)
        table |= np.where(np.char.isalnum(chars), WORD, 0).astype(np.uint8)
        table |= np.where(np.char.isalpha(chars), LETTER, 0).astype(np.uint8)
        table[ord("_")] |= WORD
        for lo, hi in CJK_RANGES:
            table[lo:hi + 1] |= CJK
        for lo, hi in HAN_RANGES:
            table[lo:hi + 1] |= HAN
        table[[ord(c) for c in COMMON_HAN]] |= COMMON
        table[0xD800:0xE000] = 0
        _CLASSES = table
    return _CLASSES


# -- the compiled passes --------------------------------------------------------------------

_KERNELS = None
KERNEL_MODULE = "llmkit.data._rule_kernels"
_SIGNATURES = {  # of the passes compiled ahead of time: the arrays Doc hands them
    "word_stats": "UniTuple(i8, 10)(u4[::1], u1[::1], u8[::1], u8[::1], i8[::1])",
    "repetition_stats": "void(u8[::1], i8[::1], i8[::1], i8[::1], i8[::1], i8[::1])",
}


def kernels():
    """The passes of llmkit.data._rule_kernels: compiled ahead of time where that can be had,
    else through numba's JIT (see llmkit.aot)."""
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = aot.load(KERNEL_MODULE, _SIGNATURES, what="the quality rules' passes",
                            warm_up=_first_call)
    return _KERNELS


def _first_call(module) -> None:
    module.word_stats(np.zeros(1, np.uint32), _char_classes(), np.zeros(0, np.uint64),
                      np.zeros(1, np.uint64), np.zeros(1, np.int64))


def word_stats(text: str, stop_hashes) -> tuple:
    """(hash of each word, length of each word, WordCounts) of `text`, words cut as
    `Doc.words` cuts them, by the compiled pass."""
    codes = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    hashes, lengths = np.empty(len(codes), np.uint64), np.empty(len(codes), np.int64)
    counts = WordCounts(*kernels().word_stats(codes, _char_classes(), stop_hashes, hashes,
                                              lengths))
    return hashes[:counts.words], lengths[:counts.words], counts


def repetition_stats(hashes, lengths, top_ns, dup_ns) -> tuple[list[int], list[int]]:
    """(top, dup): Gopher's n-gram repetition measures of the words given as hashes and
    lengths, indexed by n (see llmkit.data._rule_kernels.repetition_stats)."""
    size = max(top_ns.max(), dup_ns.max()) + 1
    top, dup = np.zeros(size, np.int64), np.zeros(size, np.int64)
    kernels().repetition_stats(hashes, lengths, top_ns, dup_ns, top, dup)
    return top.tolist(), dup.tolist()


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(items that repeat an earlier one, characters in those repeats)."""
    if len(set(items)) == len(items):
        return 0, 0
    counts = Counter(items)
    repeats = [(item, n - 1) for item, n in counts.items() if n > 1]
    return sum(r for _, r in repeats), sum(len(item) * r for item, r in repeats)


# ---------------------------------------------------------------- the rules


def boilerplate_lines(doc: Doc, cfg) -> str | None:
    """Nothing but boilerplate: every line was navigation, cookie or copyright chrome."""
    if doc.dropped_lines and not doc.text:
        return "boilerplate_lines"
    return None


def c4_lorem_ipsum(doc: Doc, cfg) -> str | None:
    """C4: placeholder text marks a template page, not content."""
    if "psum" in doc.text and "lorem ipsum" in doc.text.lower():
        return "c4_lorem_ipsum"
    return None


def gopher_min_words(doc: Doc, cfg) -> str | None:
    """Too few non-symbol words; CJK documents count one word per character, with jieba too."""
    if doc.is_cjk:
        short = doc.counts.content_words_by_char < cfg.cjk_min_words
    else:
        short = doc.content_words < cfg.min_words
    return "gopher_min_words" if short else None


def gopher_max_words(doc: Doc, cfg) -> str | None:
    if doc.content_words > cfg.max_words:
        return "gopher_max_words"
    return None


def gopher_mean_word_length(doc: Doc, cfg) -> str | None:
    """Mean length of non-symbol words outside [min, max]: tables of numbers, base64, URLs.

    Not for CJK documents, whose words are single characters.
    """
    if doc.is_cjk or not doc.content_words:
        return None
    mean = (doc.counts.word_chars - doc.counts.symbol_chars) / doc.content_words
    if not cfg.min_mean_word_length <= mean <= cfg.max_mean_word_length:
        return "gopher_mean_word_length"
    return None


def gopher_symbol_ratio(doc: Doc, cfg) -> str | None:
    """Hash marks or ellipses per word above the limit: tag clouds, truncated teasers."""
    n = doc.counts.words
    if not n:
        return None
    hashes = doc.text.count("#")
    ellipses = doc.text.count("...") + doc.text.count("…")
    if max(hashes, ellipses) / n > cfg.max_symbol_word_ratio:
        return "gopher_symbol_ratio"
    return None


def gopher_bullet_lines(doc: Doc, cfg) -> str | None:
    """Almost every line a bullet point: menus and link lists."""
    lines = doc.lines
    if lines and sum(map(str.startswith, map(str.lstrip, lines), repeat(BULLETS))) > \
            cfg.max_bullet_lines * len(lines):
        return "gopher_bullet_lines"
    return None


def gopher_ellipsis_lines(doc: Doc, cfg) -> str | None:
    """Many lines cut off with an ellipsis: lists of truncated teasers."""
    lines = doc.lines
    if lines and sum(map(str.endswith, lines, repeat(ELLIPSES))) > cfg.max_ellipsis_lines * len(lines):
        return "gopher_ellipsis_lines"
    return None


def gopher_alpha_words(doc: Doc, cfg) -> str | None:
    """Too few words with a letter (CJK characters are letters): numbers, codes, tables.

    Punctuation-only words are left out of the ratio: in CJK text every mark is its own word.
    """
    if not doc.content_words:
        return None
    letterless = doc.counts.letterless_words - doc.counts.symbol_words
    if doc.content_words - letterless < cfg.min_alpha_words * doc.content_words:
        return "gopher_alpha_words"
    return None


def gopher_stop_words(doc: Doc, cfg) -> str | None:
    """Fewer than `min_stop_words` distinct English stop words: not running English prose."""
    if doc.is_cjk:
        return None
    if doc.counts.stop_words < cfg.min_stop_words:
        return "gopher_stop_words"
    return None


def cjk_common_chars(doc: Doc, cfg) -> str | None:
    """Too few of the 1,000 most common Han characters: random characters, not Chinese."""
    if not doc.is_cjk:
        return None
    han = doc.counts.han_chars
    if han < cfg.cjk_common_chars_min_han:
        return None
    if doc.counts.common_han_chars < cfg.cjk_min_common_chars * han:
        return "cjk_common_chars"
    return None


def gopher_dup_lines(doc: Doc, cfg) -> str | None:
    lines = doc.lines
    if lines and doc.line_repeats[0] > cfg.max_dup_lines * len(lines):
        return "gopher_dup_lines"
    return None


def gopher_dup_paragraphs(doc: Doc, cfg) -> str | None:
    paragraphs = doc.paragraphs
    if paragraphs and doc.paragraph_repeats[0] > cfg.max_dup_paragraphs * len(paragraphs):
        return "gopher_dup_paragraphs"
    return None


def gopher_dup_line_chars(doc: Doc, cfg) -> str | None:
    if doc.text and doc.line_repeats[1] > cfg.max_dup_line_chars * len(doc.text):
        return "gopher_dup_line_chars"
    return None


def gopher_dup_paragraph_chars(doc: Doc, cfg) -> str | None:
    if doc.text and doc.paragraph_repeats[1] > cfg.max_dup_paragraph_chars * len(doc.text):
        return "gopher_dup_paragraph_chars"
    return None


def gopher_top_ngrams(doc: Doc, cfg) -> str | None:
    """The most frequent word n-gram (n = 2, 3, 4) covers too many characters: spam, chants."""
    top, _, total, scale = doc.ngram_stats
    for n, limit in enumerate(cfg.max_top_ngram_chars, start=2):
        if total and top[round(n * scale)] > limit * total:
            return "gopher_top_ngrams"
    return None


def gopher_dup_ngrams(doc: Doc, cfg) -> str | None:
    """Repeated word n-grams (n = 5 … 10) cover too many characters: copy-pasted blocks."""
    _, dup, total, scale = doc.ngram_stats
    for n, limit in enumerate(cfg.max_dup_ngram_chars, start=5):
        if total and dup[round(n * scale)] > limit * total:
            return "gopher_dup_ngrams"
    return None


def fineweb_line_punctuation(doc: Doc, cfg) -> str | None:
    """Too few lines end a sentence: menus, lists of links, keyword dumps."""
    lines = doc.lines
    if lines and sum(map(str.endswith, lines, repeat(TERMINAL_PUNCTUATION))) < \
            cfg.min_terminal_lines * len(lines):
        return "fineweb_line_punctuation"
    return None


RULES = (
    boilerplate_lines,
    c4_lorem_ipsum,
    gopher_min_words,
    gopher_max_words,
    gopher_mean_word_length,
    gopher_symbol_ratio,
    gopher_bullet_lines,
    gopher_ellipsis_lines,
    gopher_alpha_words,
    gopher_stop_words,
    cjk_common_chars,
    gopher_dup_lines,
    gopher_dup_paragraphs,
    gopher_dup_line_chars,
    gopher_dup_paragraph_chars,
    gopher_top_ngrams,
    gopher_dup_ngrams,
    fineweb_line_punctuation,
)
RULE_NAMES = tuple(rule.__name__ for rule in RULES)


def first_failed_rule(doc: Doc, cfg, rules=RULES) -> str | None:
    """The reason of the first rule in `rules` that rejects `doc`, or None to keep it."""
    for rule in rules:
        reason = rule(doc, cfg)
        if reason is not None:
            return reason
    return None
