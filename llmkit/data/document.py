"""What the quality rules (llmkit.data.rules) read of a document: `Doc` and its measurements.

The rules share one `Doc`, whose measurements are computed once. Every number a rule
reads (word counts, symbol and letter counts, the lines and paragraphs with their repeats, the
marks, the n-gram statistics; jieba's words aside) comes from one compiled pass over the
text's code points (`measure_texts`, llmkit.data._rule_kernels, compiled ahead of time: see
llmkit.core.aot), which `clean_batch` makes once for a whole batch: per document, Python only
compares numbers with thresholds. Text is cut once (into words, lines, paragraphs) and each
cut serves every rule that reads it.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import NamedTuple

import numpy as np

from llmkit.core import aot
from llmkit.tokenizers.cjk import (CJK_CHAR, CJK_CLASS, CJK_RANGES, COMMON_HAN, HAN_CHAR, HAN_RANGES,
                        jieba_words)

_TOKEN = re.compile(f"[{CJK_CLASS}]|[^\\s{CJK_CLASS}]+")  # Doc.words of CJK text
# Symbol words (no letter, digit or "_") of CJK text in " " + text + " ", for jieba's case
# (the compiled pass counts them otherwise).
_CJK_SYMBOL_WORD = re.compile(f"[^\\w\\s](?<=[\\s{CJK_CLASS}].)[^\\w\\s]*(?=[\\s{CJK_CLASS}])")
_HAS_WORD_CHAR = re.compile(r"\w")
_LETTER = re.compile(r"[^\W\d_]")

GOPHER_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
BULLETS = ("•", "‣", "●", "○", "◦", "▪", "■", "□", "-", "*", "·", "–")
ELLIPSES = ("...", "…")  # the compiled pass looks for these two (_rule_kernels._layout)
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
    """One normalised document and the measurements rules share, each computed at most once.

    `state` is the rules' per-process holder of the config (llmkit.data.rule_state):
    `doc.state` what is built from it, `doc.cfg` the config itself. The measurements come
    from the document's row of `measure_texts`: `measured`, where the caller measured a whole
    batch, else the document is measured alone, here. Jieba's words, and the n-grams of a
    document over `max_words` words, are taken on first use instead.
    """

    def __init__(self, text: str, state, *, dropped_lines: int = 0, measured: list | None = None):
        self.text = text
        self.state = state
        self.cfg = cfg = state.cfg
        self.dropped_lines = dropped_lines  # boilerplate lines removed before the rules ran
        self.jieba = cfg.cjk_words == "jieba" and not text.isascii() and \
            CJK_CHAR.search(text) is not None
        row = measure_texts([text], state)[0] if measured is None else measured
        # Set here rather than on first use: the rules read them all, and a first use costs
        # more than building them.
        self.layout = Layout._make(row[WORD_FIELDS:WORD_FIELDS + LAYOUT_FIELDS])
        self._ngram_row = row[WORD_FIELDS + LAYOUT_FIELDS:]
        if not self.jieba:
            self.counts = WordCounts._make(row[:WORD_FIELDS])

    @_once
    def words(self) -> list[str]:
        if self.jieba:
            return jieba_words(self.text)
        if self.text.isascii() or not CJK_CHAR.search(self.text):
            return self.text.split()
        return _TOKEN.findall(self.text)

    @_once
    def counts(self) -> "WordCounts":
        """Word counts of jieba's words (theirs, with their hashes and lengths left in
        `word_hashes`, `word_lengths` for the n-gram rules); other documents have the
        compiled pass's from the start."""
        self.word_hashes, self.word_lengths, counts = _counts_of_words(self.text, self.words,
                                                                       self.state.stop_words)
        return counts

    @property
    def cjk_chars(self) -> int:
        return self.counts.cjk_chars

    @_once
    def content_words(self) -> int:
        """Gopher's word count: words that are not just punctuation or symbols."""
        return self.counts.words - self.counts.symbol_words

    @_once
    def is_cjk(self) -> bool:
        """CJK characters are at least `cjk_min_fraction` of the words (one per character).
        (llmkit.data._rule_kernels.measure decides the same way which n-gram sizes to use.)"""
        c = self.counts
        if not c.cjk_chars:
            return False
        other = c.content_words_by_char - c.cjk_chars
        return c.cjk_chars >= self.cfg.cjk_min_fraction * (c.cjk_chars + other)

    @_once
    def ngram_stats(self) -> tuple[list[int], list[int], int]:
        """(top, dup, chars): for each limit of `max_top_ngram_chars`, the characters the
        most frequent n-gram covers; for each of `max_dup_ngram_chars`, the characters covered
        by repeated n-grams; and the characters in words they are relative to.

        n is in words, times `cjk_ngram_scale` for CJK documents cut into characters.
        Documents shorter than `ngram_min_words` (scaled) get all zeros: in a short text one
        echoed phrase is a large fraction, and that is style (a refrain, a couplet), not spam.
        """
        cfg = self.cfg
        n_top, n_dup = _ngram_columns(cfg)
        row = self._ngram_row
        if not self.jieba and row[0] >= 0:  # the compiled pass's: chars, n_top tops, the dups
            return row[1:1 + n_top], row[1 + n_top:], row[0]
        if self.jieba:  # jieba's words are words
            counts, scale = self.counts, 1.0
            hashes, lengths = self.word_hashes, self.word_lengths
        else:  # over max_words words, so most likely removed by gopher_max_words first: the
            # compiled pass left these, the largest part of such a document's cost, to here
            hashes, lengths, counts = word_stats(self.text, self.state.stop_hashes)
            scale = cfg.cjk_ngram_scale if self.is_cjk else 1.0
        top_ns, dup_ns = _ngram_sizes(n_top, n_dup, scale)
        if counts.words < cfg.ngram_min_words * scale:
            return [0] * n_top, [0] * n_dup, 0
        top, dup = repetition_stats(hashes, lengths, top_ns, dup_ns)
        return [top[n] for n in top_ns], [dup[n] for n in dup_ns], counts.word_chars


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


class Layout(NamedTuple):
    """Lines, paragraphs and marks, from the compiled pass."""
    lines: int  # non-empty lines (normalisation has already stripped trailing whitespace)
    bullet_lines: int  # lines whose first non-space character is one of BULLETS
    ellipsis_lines: int  # lines ending with one of ELLIPSES
    terminal_lines: int  # lines ending with one of TERMINAL_PUNCTUATION
    dup_lines: int  # lines equal to an earlier line
    dup_line_chars: int  # characters in them
    paragraphs: int  # non-empty pieces between "\n\n"
    dup_paragraphs: int
    dup_paragraph_chars: int
    hash_marks: int  # "#"
    ellipses: int  # "..." (as str.count counts them) and "…"


WORD_FIELDS, LAYOUT_FIELDS = len(WordCounts._fields), len(Layout._fields)


def _counts_of_words(text: str, words: list[str], stop_words: frozenset):
    """The compiled pass's results, for words cut by jieba."""
    symbols = [w for w in words if not _HAS_WORD_CHAR.search(w)]
    cjk = CJK_CHAR.subn("", text)[1]
    by_char = len(_TOKEN.findall(text)) - len(_CJK_SYMBOL_WORD.findall(f" {text} "))
    han = HAN_CHAR.findall(text)
    counts = WordCounts(len(words), len(symbols), sum(map(len, symbols)),
                        sum(not _LETTER.search(w) for w in words), cjk, sum(map(len, words)),
                        by_char, len(han), sum(map(COMMON_HAN.__contains__, han)),
                        len(stop_words.intersection(words)))
    # Python's string hash is salted per process, but only equality within a document
    # matters, so every worker gets the same result (barring a 2**-64 collision).
    hashes = np.fromiter(map(hash, words), np.int64, len(words)).view(np.uint64)
    return hashes, np.fromiter(map(len, words), np.int64, len(words)), counts


_NGRAM_SIZES: dict = {}


def _ngram_sizes(n_top: int, n_dup: int, scale: float):
    """The n of each top n-gram limit (2, 3, …) and repeated n-gram limit (5, 6, …), scaled
    (a 0 stands in for an empty list)."""
    key = (n_top, n_dup, scale)
    if key not in _NGRAM_SIZES:
        top = [round(n * scale) for n in range(2, 2 + n_top)] or [0]
        dup = [round(n * scale) for n in range(5, 5 + n_dup)] or [0]
        _NGRAM_SIZES[key] = (np.array(top, np.int64), np.array(dup, np.int64))
    return _NGRAM_SIZES[key]


def _ngram_columns(cfg) -> tuple[int, int]:
    """How many top and dup measures `measure_texts` gives: one per limit, at least one."""
    return max(1, len(cfg.max_top_ngram_chars)), max(1, len(cfg.max_dup_ngram_chars))


def measure_params(cfg):
    """The n-gram arguments of the compiled `measure` for `cfg`: (params, top_ns, dup_ns),
    built once per process with the rules' holder (RuleState.measure_params)."""
    ngrams = {"gopher_top_ngrams", "gopher_dup_ngrams"} - set(cfg.disabled_rules)
    n_top, n_dup = _ngram_columns(cfg)
    plain, cjk = _ngram_sizes(n_top, n_dup, 1.0), _ngram_sizes(n_top, n_dup, cfg.cjk_ngram_scale)
    # The fewest words that get n-gram measures, as Doc.ngram_stats compares them (none get
    # them when both n-gram rules are off), and the most (see Doc.ngram_stats).
    fewest = [cfg.ngram_min_words * 1.0, cfg.ngram_min_words * cfg.cjk_ngram_scale]
    params = np.array([cfg.cjk_min_fraction] + (fewest if ngrams else [np.inf] * 2)
                      + [cfg.max_words])
    return params, np.stack([plain[0], cjk[0]]), np.stack([plain[1], cjk[1]])


# Bits of a character's class. BULLET: one of BULLETS; TERMINAL: one of TERMINAL_PUNCTUATION.
SPACE, CJK, WORD, LETTER, HAN, COMMON, BULLET, TERMINAL = 1, 2, 4, 8, 16, 32, 64, 128


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
        table[[ord(c) for c in BULLETS]] |= BULLET  # single characters, all of them
        table[[ord(c) for c in TERMINAL_PUNCTUATION]] |= TERMINAL
        table[0xD800:0xE000] = 0
        _CLASSES = table
    return _CLASSES


# -- the compiled passes --------------------------------------------------------------------

_KERNELS = None
KERNEL_MODULE = "llmkit.data._rule_kernels"
_SIGNATURES = {  # of the passes compiled ahead of time: the arrays their callers hand them
    "scan": "void(u4[::1], i8[::1], u1[::1], b1, i8, i8[::1])",  # llmkit.data.normalize's
    "measure": "void(u4[::1], i8[::1], u1[::1], u8[::1], f8[::1], i8[:, ::1], i8[:, ::1], "
               "i8[:, ::1])",
    "word_stats": "UniTuple(i8, 10)(u4[::1], u1[::1], u8[::1], u8[::1], i8[::1])",
    "repetition_stats": "void(u8[::1], i8[::1], i8[::1], i8[::1], i8[::1], i8[::1])",
}


def kernels():
    """The passes of llmkit.data._rule_kernels: compiled ahead of time where that can be had,
    else through numba's JIT (see llmkit.core.aot)."""
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = aot.load(KERNEL_MODULE, _SIGNATURES, what="the quality rules' passes",
                            warm_up=_first_call)
    return _KERNELS


def _first_call(module) -> None:
    """A call of each pass on a tiny input, so that numba compiles them all now."""
    codes, classes, none = np.zeros(1, np.uint32), np.zeros(1, np.uint8), np.zeros(0, np.uint64)
    ends, sizes = np.ones(1, np.int64), np.zeros((2, 1), np.int64)
    module.scan(codes, ends, classes, True, 3, np.zeros(1, np.int64))
    module.measure(codes, ends, classes, none, np.zeros(4), sizes, sizes,
                   np.zeros((1, WORD_FIELDS + LAYOUT_FIELDS + 3), np.int64))
    module.word_stats(codes, classes, none, np.zeros(1, np.uint64), np.zeros(1, np.int64))
    module.repetition_stats(none, np.zeros(0, np.int64), *np.zeros((4, 1), np.int64))


def measure_texts(texts: list[str], state) -> list[list[int]]:
    """Per text, the row Doc reads its measurements from: WordCounts, Layout, then the n-gram
    measures (see llmkit.data._rule_kernels.measure). One compiled call for all the texts:
    per text, a call would cost more than the measuring. (A lone surrogate, which no Arrow
    string holds, is a symbol.) `state`: the config's RuleState."""
    codes = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), np.uint32)
    ends = np.fromiter(accumulate(map(len, texts)), np.int64, len(texts))
    params, top_ns, dup_ns = state.measure_params
    out = np.zeros((len(texts), WORD_FIELDS + LAYOUT_FIELDS + 1 + top_ns.shape[1] + dup_ns.shape[1]),
                   np.int64)
    kernels().measure(codes, ends, _char_classes(), state.stop_hashes, params, top_ns, dup_ns,
                      out)
    return out.tolist()


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
