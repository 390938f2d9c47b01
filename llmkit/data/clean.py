"""`llmkit clean`: normalise text, drop boilerplate lines, remove documents that fail a rule.

Per document, in order:
1. normalise (llmkit.data.normalize): HTML tags/entities, control and invisible characters,
   Unicode NFKC, whitespace, runs of repeated punctuation;
2. the row rules (`llmkit.data.rules.ROW_RULES`): a URL on the block list (`url`), a language
   not kept (`language`; the row's `lang_id`/`script` from ingest, else identified here);
3. drop boilerplate lines: navigation bars, cookie/copyright/JavaScript notices (C4's line
   filter, extended with common Chinese site chrome);
4. drop the lines found in many documents of the corpus (llmkit.data.line_dedup, when
   `line_dedup_min_docs` is set; a document left empty is removed as `line_dedup`);
5. redact PII (llmkit.data.pii, the types in `pii`);
6. the quality rules of `llmkit.data.rules`, first objection wins.

Kept rows carry the cleaned text; removed rows keep their original text plus a `reason`
(the rule's name). Every step is a pure function of one row, the config and (line dedup) the
corpus' frequent lines, so any batching and any number of workers give the same output. The
manifest counts what was edited in kept rows: `pii_redacted` per type, and `line_dedup`
(frequent lines, lines cut). The stage's phases and tasks: llmkit.data.clean_stage.

Speed: the normalisation steps run only where a compiled scan found work for them
(llmkit.data.normalize), and the rules' measurements are taken in one compiled pass
(llmkit.data.document.measure_texts).
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from llmkit.data.document import GOPHER_STOP_WORDS, TERMINAL_PUNCTUATION, Doc, measure_texts
from llmkit.data.driver import DataConfig
from llmkit.data.langid import known_languages
from llmkit.data.line_dedup import drop_frequent_lines
from llmkit.data.normalize import BLANK_LINE_RUNS, normalize_text, scan_texts
from llmkit.data.pii import PII_TYPES, redact
from llmkit.data.rule_state import RuleState, read_url_blocklist, rule_state
from llmkit.data.rules import RULE_NAMES, ROW_RULES, Row, first_failed_rule
from llmkit.errors import ConfigError

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
class CleanConfig(DataConfig):
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
    # --- web pages (llmkit.data.rules.ROW_RULES, llmkit.data.line_dedup, llmkit.data.pii)
    keep_langs: list[str] = field(default_factory=list)  # keep only these languages (lang_id codes, or zh-Hans / zh-Hant); []: all
    min_lang_score: float = 0.0  # … and only rows identified with at least this probability
    url_blocklist: str | None = None  # file: a domain or URL substring per line; rows whose url matches are removed (url)
    line_dedup_min_docs: int = 0  # a line found in ≥ this many documents is cut from all of them (0: off)
    pii: list[str] = field(default_factory=list)  # PII types to redact: email, ip, cn_id, bank_card, phone
    # --- switches
    disabled_rules: list[str] = field(default_factory=list)  # rule names to skip

    def __post_init__(self):
        for name in self.disabled_rules:
            if name not in RULE_NAMES:
                close = difflib.get_close_matches(name, RULE_NAMES, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"rules: {', '.join(RULE_NAMES)}"
                raise ConfigError(f"clean.disabled_rules: unknown rule {name!r}; {hint}")
        fractions = ["cjk_min_fraction", "max_symbol_word_ratio", "max_bullet_lines",
                     "max_ellipsis_lines", "min_alpha_words", "cjk_min_common_chars",
                     "max_dup_lines", "max_dup_paragraphs", "max_dup_line_chars",
                     "max_dup_paragraph_chars", "min_terminal_lines", "min_lang_score"]
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
        _check_names("pii", self.pii, PII_TYPES)
        if self.keep_langs:
            _check_names("keep_langs", self.keep_langs, sorted(known_languages()))
        if self.line_dedup_min_docs == 1 or self.line_dedup_min_docs < 0:
            raise ConfigError("clean.line_dedup_min_docs must be 0 (off) or ≥ 2 (1 would cut "
                              f"every line), got {self.line_dedup_min_docs}")
        # read to refuse a missing or unreadable list now; what the rules use of it is
        # built per process (llmkit.data.rule_state), never kept here
        read_url_blocklist(self.url_blocklist)


def _check_names(key: str, names: list[str], valid) -> None:
    for name in names:
        if name not in valid:
            close = difflib.get_close_matches(name, list(valid), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"one of: {', '.join(valid)}"
            raise ConfigError(f"clean.{key}: unknown {name!r}; {hint}")


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
        state = rule_state(cfg)
        anchors = state.ascii_anchors if text.isascii() else state.ascii_anchors + state.other_anchors
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
    return BLANK_LINE_RUNS.sub("\n\n", "\n".join(kept)).strip("\n"), dropped

# ---------------------------------------------------------------- rows and batches


def clean_text(text: str, cfg: CleanConfig) -> tuple[str, str | None]:
    """(normalised text, None) to keep a document, or (normalised text, reason) to remove it.
    (Quality rules only: the row rules need the row's columns, line dedup the corpus.)"""
    state = rule_state(cfg)
    text = normalize_text(text, cfg)
    text, dropped = drop_boilerplate_lines(text, cfg)
    return text, first_failed_rule(Doc(text, state, dropped_lines=dropped), cfg, state.rules)


def clean_batch(batch, config: CleanConfig, frequent_lines: frozenset = frozenset()):
    """(kept table with cleaned `text`, removed table with original `text` and `reason`)."""
    kept, removed, _ = clean_batch_counted(batch, config, frequent_lines)
    return kept, removed


def clean_batch_counted(batch, config: CleanConfig, frequent_lines: frozenset = frozenset()):
    """`clean_batch`, and what it edited in the kept rows: `pii_<type>` values redacted,
    `line_dedup_lines` lines cut as frequent across the corpus."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    # The compiled passes (scan, measure) are made once for the batch.
    state = rule_state(config)  # built once per process; a pool worker meets it again here
    texts = [text or "" for text in table.column("text").to_pylist()]
    rows = _row_columns(table, state)
    cleaned, dropped, reasons, edits = [], [], [], []
    for text, found, row in zip(texts, scan_texts(texts, config), rows):
        text, n, reason, edited = _clean_row(text, found, row, state, frequent_lines)
        cleaned.append(text)
        dropped.append(n)
        reasons.append(reason)
        edits.append(edited)
    for i, measured in enumerate(measure_texts(cleaned, state)):
        if reasons[i] is None:
            reasons[i] = first_failed_rule(Doc(cleaned[i], state, dropped_lines=dropped[i],
                                               measured=measured), config, state.rules)
    counted = sum((e for e, r in zip(edits, reasons) if r is None), Counter())
    keep = pa.array([r is None for r in reasons], pa.bool_())
    index = table.schema.get_field_index("text")
    text_field = table.schema.field(index)
    normalised = table.set_column(index, text_field, pa.array(cleaned, text_field.type))
    kept = normalised.filter(keep)
    removed = table.filter(pc.invert(keep))
    removed = removed.append_column("reason", pa.array([r for r in reasons if r is not None],
                                                       pa.string()))
    return kept, removed, counted


ROW_COLUMNS = ("url", "lang_id", "lang_score", "script")  # what the row rules read


def _row_columns(table, state: RuleState) -> list[dict | None]:
    """Per row, the columns the row rules read (None everywhere when no row rule is on)."""
    n = table.num_rows
    if not (state.cfg.keep_langs or any(state.url_blocklist)):
        return [None] * n
    cols = [table.column(c).to_pylist() if c in table.column_names else [None] * n
            for c in ROW_COLUMNS]
    return [dict(zip(ROW_COLUMNS, values)) for values in zip(*cols)]


def _clean_row(text: str, found: int, row: dict | None, state: RuleState,
               frequent_lines: frozenset) -> tuple[str, int, str | None, Counter]:
    """(cleaned text, boilerplate lines dropped, reason to remove it or None (the quality
    rules still to come), what was edited) of one row."""
    cfg = state.cfg
    edits: Counter = Counter()
    text = normalize_text(text, cfg, found)
    if row is not None:
        if cfg.keep_langs and row["lang_id"] is None:  # not identified at ingest: here
            row.update(state.languages.columns(text))
        reason = first_failed_rule(Row(row, state), cfg, ROW_RULES)
        if reason is not None:
            return text, 0, reason, edits
    text, dropped = drop_boilerplate_lines(text, cfg)
    if frequent_lines:
        text, cut = drop_frequent_lines(text, frequent_lines)
        if cut and not text:
            return text, dropped, "line_dedup", edits
        edits["line_dedup_lines"] += cut
    if cfg.pii:
        text, found_pii = redact(text, cfg.pii)
        edits.update({f"pii_{kind}": n for kind, n in found_pii.items()})
    return text, dropped, None, edits
