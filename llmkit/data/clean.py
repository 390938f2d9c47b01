"""`llmkit clean`: normalise text, drop boilerplate lines, remove documents that fail a rule.

Per document, in order:
1. normalise: HTML tags/entities, control and invisible characters, Unicode NFKC, whitespace,
   runs of repeated punctuation;
2. drop boilerplate lines: navigation bars, cookie/copyright/JavaScript notices (C4's line
   filter, extended with common Chinese site chrome);
3. the quality rules of `llmkit.data.rules`, first objection wins.

Kept rows carry the normalised text; removed rows keep their original text plus a `reason`
(the rule's name). Every step is a pure function of one row and the config, so any batching
and any number of workers give the same output.

Speed. Most steps change nothing in most documents, and finding that out (a regular
expression, a few `in` searches) was most of their cost. So one compiled pass over a batch's
code points (`scan_texts`, llmkit.data._rule_kernels.scan) first notes for each text which
steps have work in it, and a step runs only where it has; a step that changes the text has
the text scanned again. The rules' measurements are then taken in one compiled pass too
(llmkit.data.document.measure_texts).
"""

from __future__ import annotations

import difflib
import html
import re
import unicodedata
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Literal

import numpy as np

from llmkit.data.document import (GOPHER_STOP_WORDS, TERMINAL_PUNCTUATION, Doc, kernels,
                                  measure_texts, word_hash)
from llmkit.data.rules import RULE_NAMES, RULES, first_failed_rule
from llmkit.errors import ConfigError
from llmkit.executor import RayConfig, executor_field, ray_field

# C4 drops lines containing "javascript" and these policy phrases. A bare "javascript" also
# cuts "JSON is a subset of JavaScript syntax" out of real text, so only the browser warnings
# are listed. The rest is the same kind of site chrome in English and Chinese: analytics
# snippets, copyright and ICP notices, "follow our WeChat account", "get our app".
# Matched case-insensitively.
BOILERPLATE_PHRASES = [
    "enable javascript", "requires javascript", "support javascript", "javascript is disabled",
    "terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies",
    "use cookies", "all rights reserved", "skip to main content", "subscribe to our newsletter",
    "_gaq.push(", "gtag(", "datalayer.push(",
    "启用 javascript", "支持 javascript", "版权所有", "保留所有权利", "icp备", "免责声明",
    "隐私政策", "微信公众号", "扫描二维码", "手机客户端",
]


@dataclass
class CleanConfig:
    # --- normalisation
    strip_html: bool = True  # drop tags, comments, <script>/<style>; decode &entities;
    strip_control: bool = True  # drop control chars (NUL, ESC…) and invisible ones (zero-width, BOM)
    nfkc: bool = True  # Unicode NFKC: full-width ASCII → ASCII, ligatures unfolded
    keep_cjk_punctuation: bool = True  # keep ，！？：；（）～… that NFKC would turn into ASCII
    normalize_whitespace: bool = True  # LF line ends, no trailing spaces, inner runs → 1, ≤ 1 blank line
    max_punctuation_run: int = 3  # "!!!!!", "。。。。" → 3 marks ("====" rules stay); 0 = off
    # --- line filter (off with disabled_rules: [boilerplate_lines])
    boilerplate_phrases: list[str] = field(
        default_factory=lambda: list(BOILERPLATE_PHRASES))  # a line containing one is dropped
    c4_drop_unterminated_lines: bool = False  # C4's line filter; off: it wrecks code, verse, titles
    # --- words
    cjk_words: Literal["chars", "jieba"] = "chars"  # CJK words: one per character, or jieba's
    cjk_min_fraction: float = 0.25  # a document is CJK when CJK chars are this share of its words
    # --- Gopher quality
    min_words: int = 50  # gopher_min_words: fewer non-symbol words → removed (Gopher: 50)
    cjk_min_words: int = 8  # … for CJK documents, in characters (吃不言，睡不语 + 《谚语》 is 8)
    max_words: int = 100_000  # gopher_max_words (Gopher: 100,000)
    min_mean_word_length: float = 3.0  # gopher_mean_word_length, non-CJK (Gopher: 3 … 10)
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1  # gopher_symbol_ratio: "#" or ellipses per word (Gopher)
    max_bullet_lines: float = 0.9  # gopher_bullet_lines: share of lines opening with a bullet
    max_ellipsis_lines: float = 0.3  # gopher_ellipsis_lines: share of lines ending in "…"
    min_alpha_words: float = 0.8  # gopher_alpha_words: share of words with a letter (Gopher)
    stop_words: list[str] = field(
        default_factory=lambda: list(GOPHER_STOP_WORDS))  # gopher_stop_words (Gopher's 8)
    min_stop_words: int = 2  # distinct stop words a non-CJK document needs (Gopher: 2)
    cjk_min_common_chars: float = 0.15  # cjk_common_chars: share of Han among the 1,000 commonest
    cjk_common_chars_min_han: int = 20  # … checked from this many Han characters on
    # --- Gopher repetition
    max_dup_lines: float = 0.3  # gopher_dup_lines: share of lines repeating an earlier one
    max_dup_paragraphs: float = 0.3  # gopher_dup_paragraphs
    max_dup_line_chars: float = 0.2  # gopher_dup_line_chars: share of characters in repeated lines
    max_dup_paragraph_chars: float = 0.2  # gopher_dup_paragraph_chars
    ngram_min_words: int = 50  # n-gram rules skip shorter texts (a couplet's echo is not spam)
    cjk_ngram_scale: float = 2.0  # CJK by chars: n and ngram_min_words × this (a word ≈ 2 chars)
    max_top_ngram_chars: list[float] = field(
        default_factory=lambda: [0.20, 0.18, 0.16])  # gopher_top_ngrams, n = 2, 3, 4
    max_dup_ngram_chars: list[float] = field(
        default_factory=lambda: [0.15, 0.14, 0.13, 0.12, 0.11, 0.10])  # gopher_dup_ngrams, n = 5 … 10
    # --- FineWeb
    min_terminal_lines: float = 0.12  # fineweb_line_punctuation: share of lines ending a sentence
    # --- switches
    disabled_rules: list[str] = field(default_factory=list)  # rule names to skip
    allow_empty: bool = False  # write an output without rows instead of refusing it (exit 2)
    executor: Literal["local", "ray"] = executor_field()  # where tasks run (not fingerprinted)
    ray: RayConfig = ray_field()  # executor=ray: the cluster, what a task reserves

    def __post_init__(self):
        for name in self.disabled_rules:
            if name not in RULE_NAMES:
                close = difflib.get_close_matches(name, RULE_NAMES, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"rules: {', '.join(RULE_NAMES)}"
                raise ConfigError(f"clean.disabled_rules: unknown rule {name!r}; {hint}")
        fractions = ["cjk_min_fraction", "max_symbol_word_ratio", "max_bullet_lines",
                     "max_ellipsis_lines", "min_alpha_words", "cjk_min_common_chars",
                     "max_dup_lines", "max_dup_paragraphs", "max_dup_line_chars",
                     "max_dup_paragraph_chars", "min_terminal_lines"]
        for name in fractions:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"clean.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("max_top_ngram_chars", "max_dup_ngram_chars"):
            if any(not 0.0 <= v <= 1.0 for v in getattr(self, name)):
                raise ConfigError(f"clean.{name}: every value must be in [0, 1]")
        for name in ("max_punctuation_run", "min_words", "cjk_min_words", "max_words",
                     "min_stop_words", "cjk_common_chars_min_han", "ngram_min_words"):
            if getattr(self, name) < 0:
                raise ConfigError(f"clean.{name} must be ≥ 0, got {getattr(self, name)}")
        if self.cjk_ngram_scale < 1:
            raise ConfigError(f"clean.cjk_ngram_scale must be ≥ 1, got {self.cjk_ngram_scale}")
        if self.min_mean_word_length > self.max_mean_word_length:
            raise ConfigError("clean.min_mean_word_length must not exceed max_mean_word_length")
        if self.min_words > self.max_words:
            raise ConfigError("clean.min_words must not exceed max_words")
        if any(not p.strip() for p in self.boilerplate_phrases):
            raise ConfigError("clean.boilerplate_phrases: empty phrases would match every line")
        # Derived once per config; not fields, so not in config.yaml or the fingerprint.
        anchors = _phrases_by_anchor(self.boilerplate_phrases)
        self._ascii_anchors = [(a, ps) for a, ps in anchors if a.isascii()]
        self._other_anchors = [(a, ps) for a, ps in anchors if not a.isascii()]
        self._rules = tuple(r for r in RULES if r.__name__ not in self.disabled_rules)
        self._stop_words = frozenset(self.stop_words)
        self._stop_hashes = np.array(sorted({word_hash(w) for w in self.stop_words}), np.uint64)


def _phrases_by_anchor(phrases: list[str]) -> list[tuple[str, list[str]]]:
    """Lower-cased phrases grouped under their longest word, so that one search for "cookie"
    stands in for "use cookies", "uses cookies" and "cookie policy" in the common case of a
    document that has none of them."""
    groups: dict[str, list[str]] = {}
    for phrase in (p.lower() for p in phrases):
        anchor = max(phrase.split(), key=len)
        groups.setdefault(anchor, []).append(phrase)
    for anchor in sorted(groups, key=len):  # "cookie" also covers the phrases of "cookies"
        if anchor not in groups:
            continue
        for longer in [a for a in groups if a != anchor and anchor in a]:
            groups[anchor] += groups.pop(longer)
    return [(a, ps) for a, ps in groups.items()]


# ---------------------------------------------------------------- normalisation

_SCRIPT_STYLE = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>|<!--.*?-->", re.I | re.S)
_BLOCK_TAGS = ("p|div|br|hr|li|ul|ol|dl|dt|dd|tr|table|thead|tbody|tfoot|h[1-6]|blockquote|pre|"
               "article|section|header|footer|nav|aside|main|figure|figcaption|form|title|body|html|"
               "head")
_INLINE_TAGS = ("a|abbr|b|i|u|s|em|strong|small|sub|sup|code|span|font|center|cite|q|strike|del|"
                "ins|mark|time|wbr|img|td|th|caption|label|input|button|select|option|textarea|"
                "iframe|meta|link|noscript|svg|path|source|video|audio|picture|canvas|tt|kbd|big")
_BR = re.compile(r"<br\s*/?>[ \t]*\n?", re.I)
_BLOCK_TAG = re.compile(rf"</?(?:{_BLOCK_TAGS})\b[^<>]*>", re.I)
_INLINE_TAG = re.compile(rf"</?(?:{_INLINE_TAGS})\b[^<>]*>", re.I)
# Only entities closed by ";": html.unescape alone would also turn "&not=2" in a URL into "¬=2".
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")

_ASCII_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_OTHER_LINE_BREAKS = re.compile("[\x0b\x0c\x85\u2028\u2029]")
_INVISIBLE = re.compile(
    "[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000e0001\U000e0020-\U000e007f]")

# NFKC folds these to ASCII; Chinese text keeps them. Each is parked on a private-use
# character during NFKC (which leaves those alone) and put back after.
_CJK_PUNCTUATION = "，！？：；（）～…"
_PARKING = "".join(chr(0xE000 + i) for i in range(len(_CJK_PUNCTUATION)))

_TRAILING_SPACE = re.compile(r"[ \t]+$", re.M)
# Patterns open with a character class, not a look-behind, so `re` can skip ahead to candidates.
_SPACE_RUNS = re.compile(r"  +")
_TAB_RUNS = re.compile(r"[ \t]*\t[ \t]*")
_BLANK_LINES = re.compile(r"\n{3,}")
_RUN_MARKS = "!?.,;:。！？，、；：~～…"
_RUN_MARKS_ASCII = "!?.,;:~"


# -- which steps have work in a text: the compiled scan

# What `scan_texts` finds in a text: one bit per step (or part of normalize_whitespace) that
# can change it. A clear bit is a promise that the step would return the text unchanged.
HTML, CONTROL, NFKC, TRAILING_SPACE, TAB, SPACE_RUN, BLANK_LINES, PUNCTUATION_RUN = \
    1, 2, 4, 8, 16, 32, 64, 128
ALL_STEPS = 255  # every step runs, as if the scan had found work for each

# Bits of a character's class for the scan. MARKUP: "<" or "&". CONTROL_CHAR: "\r" and what
# strip_control removes or turns into "\n". NOT_NFKC_STABLE: a character next to which NFKC
# might change the text (see _normalisation_classes). KEPT: one of _CJK_PUNCTUATION.
# RUN_MARK: one of _RUN_MARKS. SURROGATE: a lone surrogate, for which every step runs.
# WHITESPACE: " ", "\t", "\n". A character of none of them (most) only breaks runs.
MARKUP, CONTROL_CHAR, NOT_NFKC_STABLE, KEPT, RUN_MARK, SURROGATE, WHITESPACE = \
    1, 2, 4, 8, 16, 32, 64

_NORMALISATION_CLASSES = None


def _normalisation_classes():
    """The scan's class bits of every code point.

    NFKC leaves a text alone when every character in it has no decomposition (canonical or
    compatibility), is a starter (combining class 0) and is not the second character of any
    canonical composition: then decomposing changes nothing, there is nothing to reorder, and
    no pair composes. The other characters are NOT_NFKC_STABLE, and so, to keep the argument
    short, are Hangul jamo and syllables (composed by algorithm, not by the table) and all
    from U+30000 on (little there: CJK Extensions G and H, tags, private use). The parked
    _CJK_PUNCTUATION are starters that compose with nothing, so NFKC of the text around them
    is NFKC of each piece between them: a text whose other characters are all stable is
    unchanged by `nfkc` with keep_cjk_punctuation too.
    """
    global _NORMALISATION_CLASSES
    if _NORMALISATION_CLASSES is None:
        table = np.zeros(0x110000, np.uint8)
        table[[ord("<"), ord("&")]] |= MARKUP
        candidates = "".join(map(chr, [*range(0xD800), *range(0xE000, 0x10000),
                                       *range(0xE0000, 0xE0080)]))
        for pattern in (_ASCII_CONTROL, _OTHER_LINE_BREAKS, _INVISIBLE):
            table[[ord(m.group()) for m in pattern.finditer(candidates)]] |= CONTROL_CHAR
        table[ord("\r")] |= CONTROL_CHAR
        unstable = []
        for code in range(0x30000):
            char = chr(code)
            decomposition = unicodedata.decomposition(char)
            if decomposition or unicodedata.combining(char):
                unstable.append(code)
            parts = decomposition.split()
            if len(parts) == 2 and not decomposition.startswith("<"):
                unstable.append(int(parts[1], 16))  # the second character of a composition
        table[unstable] |= NOT_NFKC_STABLE
        for lo, hi in ((0x1100, 0x11FF), (0x3130, 0x318F), (0xA960, 0xA97F), (0xAC00, 0xD7FF),
                       (0x30000, 0x10FFFF)):
            table[lo:hi + 1] |= NOT_NFKC_STABLE
        table[[ord(c) for c in _CJK_PUNCTUATION]] |= KEPT
        table[[ord(c) for c in _RUN_MARKS]] |= RUN_MARK
        table[[ord(" "), ord("\t"), ord("\n")]] |= WHITESPACE
        table[0xD800:0xE000] = SURROGATE
        _NORMALISATION_CLASSES = table
    return _NORMALISATION_CLASSES


def scan_texts(texts: list[str], cfg: CleanConfig) -> list[int]:
    """Per text, the bits of the normalisation steps that have work in it (HTML, CONTROL, …),
    from one compiled pass over all the texts (see llmkit.data._rule_kernels.scan)."""
    codes = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), np.uint32)
    ends = np.fromiter(accumulate(map(len, texts)), np.int64, len(texts))
    found = np.zeros(len(texts), np.int64)
    kernels().scan(codes, ends, _normalisation_classes(), cfg.keep_cjk_punctuation,
                   cfg.max_punctuation_run, found)
    return found.tolist()


def strip_html(text: str) -> str:
    """Tags out (block tags become line breaks), entities decoded."""
    if "<" in text:
        text = _SCRIPT_STYLE.sub("", text)
        text = _BR.sub("\n", text)
        text = _BLOCK_TAG.sub("\n", text)
        text = _INLINE_TAG.sub("", text)
    if "&" in text:
        text = _ENTITY.sub(lambda m: html.unescape(m.group()), text)
    return text


def strip_control(text: str) -> str:
    """Line breaks of every kind → "\\n"; control and invisible characters removed; tabs kept."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.isascii() and not _ASCII_CONTROL.search(text):
        return text
    text = _OTHER_LINE_BREAKS.sub("\n", text)
    return _INVISIBLE.sub("", text)


def nfkc(text: str, keep_cjk_punctuation: bool = True) -> str:
    if text.isascii():
        return text
    if not keep_cjk_punctuation:
        return unicodedata.normalize("NFKC", text)
    if any(p in text for p in _PARKING):  # the rare text that already uses them: go piecewise
        pieces = re.split(f"([{_CJK_PUNCTUATION}])", text)
        return "".join(p if i % 2 else unicodedata.normalize("NFKC", p) for i, p in enumerate(pieces))
    parked = [(c, p) for c, p in zip(_CJK_PUNCTUATION, _PARKING) if c in text]
    for c, p in parked:
        text = text.replace(c, p)
    text = unicodedata.normalize("NFKC", text)
    for c, p in parked:
        text = text.replace(p, c)
    return text


def normalize_whitespace(text: str, found: int = ALL_STEPS) -> str:
    """Trailing spaces cut, inner runs of spaces and tabs → one space, at most one blank line.

    Leading indentation stays: it is the structure of code and verse. `found`: what
    `scan_texts` found in `text`; a part whose bit is clear is skipped. Each part only ever
    removes the work of the parts after it, never adds some (the scan counts blank lines as
    they will be once trailing spaces are gone), so the bits hold all the way through.
    """
    if found & TRAILING_SPACE:
        text = _TRAILING_SPACE.sub("", text)
    if found & TAB:
        text = _TAB_RUNS.sub(_one_space_unless_indent, text)
    if found & SPACE_RUN:  # a literal start lets `re` jump from one double space to the next
        text = _SPACE_RUNS.sub(_one_space_unless_indent, text)
    if found & BLANK_LINES:
        text = _BLANK_LINES.sub("\n\n", text)
    return text.strip("\n ")


def _one_space_unless_indent(m) -> str:
    start = m.start()
    return m.group() if start == 0 or m.string[start - 1] == "\n" else " "


def collapse_punctuation(text: str, limit: int) -> str:
    """Runs longer than `limit` of one sentence mark shrink to `limit` ("!!!!!" → "!!!")."""
    if text.isascii() and not any(mark * (limit + 1) in text for mark in _RUN_MARKS_ASCII):
        return text  # the common case, found faster than by the pattern
    return _run_pattern(limit).sub("\\1" * limit, text)


_RUN_PATTERNS: dict = {}


def _run_pattern(limit: int):
    if limit not in _RUN_PATTERNS:
        _RUN_PATTERNS[limit] = re.compile(f"([{re.escape(_RUN_MARKS)}])\\1{{{limit},}}")
    return _RUN_PATTERNS[limit]


def normalize_text(text: str, cfg: CleanConfig, found: int | None = None) -> str:
    """The normalisation steps the config asks for, in order. `found`: what `scan_texts`
    found in `text` (None: scan it here; ALL_STEPS: run every step without asking)."""
    if found is None:
        found = scan_texts([text], cfg)[0]
    if cfg.strip_html and found & HTML:
        text, found = _rescan(text, strip_html(text), found, cfg)
    if cfg.strip_control and found & CONTROL:
        text, found = _rescan(text, strip_control(text), found, cfg)
    if cfg.nfkc and found & NFKC:
        text, found = _rescan(text, nfkc(text, cfg.keep_cjk_punctuation), found, cfg)
    if cfg.normalize_whitespace:
        text = normalize_whitespace(text, found)  # spaces only: no new run of marks
    if cfg.max_punctuation_run and found & PUNCTUATION_RUN:
        text = collapse_punctuation(text, cfg.max_punctuation_run)
    return text


def _rescan(old: str, new: str, found: int, cfg: CleanConfig) -> tuple[str, int]:
    """(new, what the later steps have to do in it): a step that changed the text (entities
    decoded, full-width forms folded) may have made work for them."""
    if new is old or found == ALL_STEPS:  # re.sub and str methods return the text itself
        return new, found                 # when they change nothing
    return new, scan_texts([new], cfg)[0]


# ---------------------------------------------------------------- line filter

_NAV_ITEM = re.compile(r"[^\W\d_][\w '’&:：()-]{0,29}")


def is_navigation_line(line: str) -> bool:
    """A menu: three or more short "|"-separated items, each starting with a capital or CJK."""
    items = line.split("|")
    if len(items) < 3 or not items[0].strip():  # "| a | b |" is a table row
        return False
    for item in items:
        item = item.strip()
        if not _NAV_ITEM.fullmatch(item) or len(item.split()) > 4:
            return False
        if not (item[0].isupper() or "\u3400" <= item[0] <= "\u9fff"):
            return False
    return True


def drop_boilerplate_lines(text: str, cfg: CleanConfig) -> tuple[str, int]:
    """(text without boilerplate lines, number of lines dropped)."""
    boilerplate = "boilerplate_lines" not in cfg.disabled_rules
    phrases = []
    if boilerplate:
        low = text.lower()
        anchors = cfg._ascii_anchors if text.isascii() else cfg._ascii_anchors + cfg._other_anchors
        for anchor, group in anchors:
            if anchor in low:
                phrases += [p for p in group if p in low]
    menus = boilerplate and text.count("|") >= 2
    if not (phrases or menus or cfg.c4_drop_unterminated_lines):
        return text, 0
    lines = text.split("\n")
    kept = []
    for line in lines:
        stripped = line.strip()
        drop = stripped and (
            (phrases and any(p in stripped.lower() for p in phrases))
            or (menus and "|" in line and is_navigation_line(stripped))
            or (cfg.c4_drop_unterminated_lines and not stripped.endswith(TERMINAL_PUNCTUATION)))
        if not drop:
            kept.append(line)
    dropped = len(lines) - len(kept)
    if not dropped:
        return text, 0
    return _BLANK_LINES.sub("\n\n", "\n".join(kept)).strip("\n"), dropped


# ---------------------------------------------------------------- rows and batches


def clean_text(text: str, cfg: CleanConfig) -> tuple[str, str | None]:
    """(normalised text, None) to keep a document, or (normalised text, reason) to remove it."""
    text = normalize_text(text, cfg)
    text, dropped = drop_boilerplate_lines(text, cfg)
    return text, first_failed_rule(Doc(text, cfg, dropped_lines=dropped), cfg, cfg._rules)


def clean_batch(batch, config: CleanConfig):
    """(kept table with normalised `text`, removed table with original `text` and `reason`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    # As clean_text, but the compiled passes (scan, measure) are made once for the batch.
    texts = [text or "" for text in table.column("text").to_pylist()]
    cleaned, dropped = [], []
    for text, found in zip(texts, scan_texts(texts, config)):
        new, n = drop_boilerplate_lines(normalize_text(text, config, found), config)
        cleaned.append(new)
        dropped.append(n)
    rules = config._rules
    reasons = [first_failed_rule(Doc(text, config, dropped_lines=n, measured=m), config, rules)
               for text, n, m in zip(cleaned, dropped, measure_texts(cleaned, config))]
    keep = pa.array([r is None for r in reasons], pa.bool_())
    index = table.schema.get_field_index("text")
    text_field = table.schema.field(index)
    normalised = table.set_column(index, text_field, pa.array(cleaned, text_field.type))
    kept = normalised.filter(keep)
    removed = table.filter(pc.invert(keep))
    removed = removed.append_column("reason", pa.array([r for r in reasons if r is not None],
                                                       pa.string()))
    return kept, removed
