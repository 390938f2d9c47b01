"""Text normalisation for `llmkit clean`: HTML tags/entities, control and invisible characters,
Unicode NFKC, whitespace, runs of repeated punctuation — each a pure function of a text.

Speed. Most steps change nothing in most documents, and finding that out (a regular
expression, a few `in` searches) was most of their cost. So one compiled pass over a batch's
code points (`scan_texts`, llmkit.data._rule_kernels.scan) first notes for each text which
steps have work in it, and a step runs only where it has; a step that changes the text has
the text scanned again.

`cfg` below is a `llmkit.data.clean.CleanConfig` (its normalisation fields).
"""

from __future__ import annotations

import html
import re
import unicodedata
from itertools import accumulate

import numpy as np

from llmkit.data.document import kernels

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
BLANK_LINE_RUNS = re.compile(r"\n{3,}")
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


def scan_texts(texts: list[str], cfg) -> list[int]:
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
        text = BLANK_LINE_RUNS.sub("\n\n", text)
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


def normalize_text(text: str, cfg, found: int | None = None) -> str:
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


def _rescan(old: str, new: str, found: int, cfg) -> tuple[str, int]:
    """(new, what the later steps have to do in it): a step that changed the text (entities
    decoded, full-width forms folded) may have made work for them."""
    if new is old or found == ALL_STEPS:  # re.sub and str methods return the text itself
        return new, found                 # when they change nothing
    return new, scan_texts([new], cfg)[0]
