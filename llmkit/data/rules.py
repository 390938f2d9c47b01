"""Document quality rules (Gopher, C4, FineWeb) as small functions.

A rule is `rule(doc, cfg) -> str | None`: None keeps the document, a string is the reason it is
removed, and the reason is always the rule's own name, so the manifest counts removals per rule
and `disabled_rules` switches rules off by the same name. `RULES` is the order they run in
(cheap, decisive checks first); the first rule that objects decides the reason. `cfg` is the
plain config (thresholds); what is built from it — tables, a block list, models — is on the
per-process holder `doc.state` (llmkit.data.rule_state.RuleState), never on the config.

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

Speed: every number a rule reads is measured once per document (`llmkit.data.document`).

Row rules (`ROW_RULES`) read a row's columns rather than its text, and run before it is
normalised: `language` (the row's `lang_id`/`script`, from ingest or identified in clean) and
`url` (the row's `url` against a block list). A `Row` holds those columns and the holder.

Thresholds are the published ones unless a field's comment in `CleanConfig` says otherwise:
Gopher = Rae et al. 2021, "Scaling Language Models", appendix A; C4 = Raffel et al. 2020;
FineWeb = Penedo et al. 2024 (datatrove's FineWebQualityFilter).
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlsplit

from llmkit.data.document import Doc


class Row(NamedTuple):
    """What the row rules read: a row's columns (`url`, `lang_id`, `lang_score`, `script`)
    and the rules' per-process holder (llmkit.data.rule_state.RuleState)."""
    columns: dict
    state: object


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
    marks = doc.layout
    if max(marks.hash_marks, marks.ellipses) / n > cfg.max_symbol_word_ratio:
        return "gopher_symbol_ratio"
    return None


def gopher_bullet_lines(doc: Doc, cfg) -> str | None:
    """Almost every line a bullet point: menus and link lists."""
    lines = doc.layout.lines
    if lines and doc.layout.bullet_lines > cfg.max_bullet_lines * lines:
        return "gopher_bullet_lines"
    return None


def gopher_ellipsis_lines(doc: Doc, cfg) -> str | None:
    """Many lines cut off with an ellipsis: lists of truncated teasers."""
    lines = doc.layout.lines
    if lines and doc.layout.ellipsis_lines > cfg.max_ellipsis_lines * lines:
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
    lines = doc.layout.lines
    if lines and doc.layout.dup_lines > cfg.max_dup_lines * lines:
        return "gopher_dup_lines"
    return None


def gopher_dup_paragraphs(doc: Doc, cfg) -> str | None:
    paragraphs = doc.layout.paragraphs
    if paragraphs and doc.layout.dup_paragraphs > cfg.max_dup_paragraphs * paragraphs:
        return "gopher_dup_paragraphs"
    return None


def gopher_dup_line_chars(doc: Doc, cfg) -> str | None:
    if doc.text and doc.layout.dup_line_chars > cfg.max_dup_line_chars * len(doc.text):
        return "gopher_dup_line_chars"
    return None


def gopher_dup_paragraph_chars(doc: Doc, cfg) -> str | None:
    if doc.text and doc.layout.dup_paragraph_chars > cfg.max_dup_paragraph_chars * len(doc.text):
        return "gopher_dup_paragraph_chars"
    return None


def gopher_top_ngrams(doc: Doc, cfg) -> str | None:
    """The most frequent word n-gram (n = 2, 3, 4) covers too many characters: spam, chants."""
    top, _, chars = doc.ngram_stats
    for covered, limit in zip(top, cfg.max_top_ngram_chars):
        if chars and covered > limit * chars:
            return "gopher_top_ngrams"
    return None


def gopher_dup_ngrams(doc: Doc, cfg) -> str | None:
    """Repeated word n-grams (n = 5 … 10) cover too many characters: copy-pasted blocks."""
    _, dup, chars = doc.ngram_stats
    for covered, limit in zip(dup, cfg.max_dup_ngram_chars):
        if chars and covered > limit * chars:
            return "gopher_dup_ngrams"
    return None


def fineweb_line_punctuation(doc: Doc, cfg) -> str | None:
    """Too few lines end a sentence: menus, lists of links, keyword dumps."""
    lines = doc.layout.lines
    if lines and doc.layout.terminal_lines < cfg.min_terminal_lines * lines:
        return "fineweb_line_punctuation"
    return None


def language(row: Row, cfg) -> str | None:
    """Not one of `keep_langs` (a `lang_id` such as `fr`, or `zh-Hans`/`zh-Hant` for one
    Chinese), or identified with a probability below `min_lang_score`."""
    if not cfg.keep_langs:
        return None
    columns = row.columns
    if columns["lang_id"] not in cfg.keep_langs and columns["script"] not in cfg.keep_langs:
        return "language"
    if columns["lang_score"] < cfg.min_lang_score:
        return "language"
    return None


def url(row: Row, cfg) -> str | None:
    """The row's URL is on the block list: its host is a listed domain (or under one), or it
    holds a listed URL substring."""
    domains, pieces = row.state.url_blocklist
    link = row.columns.get("url")
    if not link or not (domains or pieces):
        return None
    try:
        host = urlsplit(link).hostname or ""
    except ValueError:  # "http://[::1": no host to judge by; the substrings still are
        host = ""
    while host:
        if host in domains:
            return "url"
        host = host.partition(".")[2]
    low = link.lower()
    return "url" if any(p in low for p in pieces) else None


ROW_RULES = (url, language)  # the URL first: it needs no language model

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


def first_failed_rule(doc: Doc | Row, cfg, rules=RULES) -> str | None:
    """The reason of the first rule in `rules` that rejects `doc`, or None to keep it."""
    for rule in rules:
        reason = rule(doc, cfg)
        if reason is not None:
            return reason
    return None
