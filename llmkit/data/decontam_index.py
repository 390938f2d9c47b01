"""The n-gram index of evaluation files that `llmkit decontaminate` looks up.

Text is compared after folding: each code point is NFKD-decomposed (full-width forms become
ASCII, ligatures and compatibility forms their plain letters), lower-cased, and stripped of
combining marks (accents) and format characters; punctuation and whitespace only separate
tokens. A token is a run of word characters, or one character of a script written without
spaces (Han, kana, Thai, Lao, Khmer, Myanmar), so Chinese is compared character by
character and English word by word, in the same pass, in mixed text too.

An evaluation file is read as `llmkit eval` reads it (llmkit.data.input_files.read_rows) and each row
becomes the texts a leak would show (`item_texts`): a question with its gold answer after
it, its choices; a prompt with its references or replies; a plain `text`. Each text gives its
n-grams (`segment_grams` in llmkit.data._decontam_kernels): 13 words, or 13 characters where
most tokens are unsegmented characters; a shorter answer, or question followed by its answer,
is one n-gram of all its tokens when it has at least `min_words` / `min_chars` of them (a
short question or choice alone is not: it is common text). Text that two distinct items of
one file share (a run of `min_words` / `min_chars` tokens: an instruction, a template) is the
benchmark's format, not one of its items: an n-gram counts only when at least `min_words` /
`min_chars` of its tokens are its item's own, and an item with no such n-gram is skipped
(`shared with other items`); a repeated row is one item, named by its first row. An n-gram
found in more than `max_items_per_ngram` items of all the files is template too, and is
dropped. The index is built once per process (`index_for`) from the config's file list.
"""

from __future__ import annotations

import hashlib
import os
import unicodedata
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

import numpy as np

from llmkit.core import aot
from llmkit.errors import UserError
from llmkit.data.input_files import eval_input, parse_question, read_rows
from llmkit.core.workspace import Workspace

TABLE_SIZE = 0x32400  # fold and class tables cover the BMP and planes 2–3 (CJK extensions)
_TABLES_VERSION = 1  # bump when fold_tables changes: the cached tables are rebuilt
SPACE, PUNCT, UNSEGMENTED, WORD = 0, 1, 2, 3  # llmkit.data._decontam_kernels' classes
_UNSEGMENTED_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x3040, 0x30FF), (0xF900, 0xFAFF),
                       (0x20000, 0x323AF), (0x0E00, 0x0EFF), (0x1780, 0x17FF),
                       (0x1000, 0x109F), (0x31F0, 0x31FF))  # the dedup shingles' scripts

KERNEL_MODULE = "llmkit.data._decontam_kernels"
_SIGNATURES = {
    "text_tokens": "Tuple((u8[::1], i8[::1], i8[::1], u1[::1], i8[::1]))"
                   "(u4[::1], i8[::1], i8[::1], u4[::1], u1[::1])",
    "segment_grams": "Tuple((u8[::1], u8[::1], i8[::1], i8[::1], i8[:, ::1]))"
                     "(u8[::1], u1[::1], i8[::1], i8, i8, i8, i8, f8, i8)",
    "build_table": "Tuple((u8[::1], i8[::1]))(u8[::1], i8[::1])",
    "find_matches": "Tuple((i8[::1], i8[::1], i8[:, ::1]))(u8[::1], i8[::1], i8[::1], i8[::1], "
                    "u8[::1], i8[::1], u8[::1], i8[::1], i8[::1], i8, b1)",
}
_KERNELS = None
_TABLES = None


def kernels():
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = aot.load(KERNEL_MODULE, _SIGNATURES, what="the decontamination kernels")
    return _KERNELS


# -- folding ------------------------------------------------------------------------------------

def _fold(char: str) -> str:
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKD", char).lower())
    return "".join(c for c in text if not unicodedata.combining(c)
                   and unicodedata.category(c) != "Cf")


def _class(code: int) -> int:
    if any(lo <= code <= hi for lo, hi in _UNSEGMENTED_RANGES):
        return UNSEGMENTED
    category = unicodedata.category(chr(code))
    if category[0] in "Z" or category == "Cc":
        return SPACE
    if category[0] in "PS":
        return PUNCT
    return WORD


def _compute_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    offsets, folded = [0], []
    for code in range(TABLE_SIZE):
        char = chr(code)
        if code < 0x80:
            target = char.lower()
        elif (unicodedata.is_normalized("NFKD", char) and char.lower() == char
              and not unicodedata.combining(char) and unicodedata.category(char) != "Cf"):
            target = char
        else:
            target = _fold(char)
        folded.extend(ord(c) for c in target)
        offsets.append(len(folded))
    classes = np.array([_class(c) for c in range(TABLE_SIZE)], np.uint8)
    return np.array(offsets, np.int64), np.array(folded, np.uint32), classes


def fold_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fold offsets, folded code points, class of each code point): code point c folds to
    cps[offsets[c]:offsets[c + 1]]. Building them takes half a second, so they are kept in
    the package's __pycache__ (per Unicode version) when it is writable."""
    global _TABLES
    if _TABLES is not None:
        return _TABLES
    cache = (Path(__file__).parent / "__pycache__" /
             f"decontam_fold_{unicodedata.unidata_version}_{_TABLES_VERSION}.npz")
    try:
        with np.load(cache) as f:
            _TABLES = f["offsets"], f["folded"], f["classes"]
            return _TABLES
    except (OSError, ValueError, KeyError):
        pass
    _TABLES = _compute_tables()
    try:
        cache.parent.mkdir(exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.tmp-{os.getpid()}.npz")
        np.savez(tmp, offsets=_TABLES[0], folded=_TABLES[1], classes=_TABLES[2])
        os.replace(tmp, cache)
    except OSError:  # a read-only install: computed in each process instead
        pass
    return _TABLES


@dataclass
class Tokens:
    """Folded tokens of n texts: text i owns hashes[offsets[i]:offsets[i + 1]]; starts and
    stops are code point (str) indices into the text."""
    hashes: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    unsegmented: np.ndarray
    offsets: np.ndarray


def tokenize(texts: list[str]) -> Tokens:
    codes = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), np.uint32)
    ends = np.fromiter(accumulate(map(len, texts)), np.int64, len(texts))
    return Tokens(*kernels().text_tokens(codes, ends, *fold_tables()))


# -- what an evaluation row shows -----------------------------------------------------------------

_ANSWER_KEYS = ("reference", "answer", "response", "chosen", "rejected", "completion")


def item_texts(row: dict) -> dict[str, bool]:
    """The texts of an evaluation row that a leak would show, in the formats `llmkit eval`
    reads, each with whether it may be shorter than an n-gram: a multiple-choice question
    (`question` + `choices` or `A`…: the question followed by its gold answer, each choice),
    a prompt with references or replies (`prompt`/`messages` + `references`/`reference`/
    `answer`/`response`/`chosen`/`rejected`: each, and the prompt followed by each), or plain
    `text`. A question, prompt or choice alone counts only by its full n-grams:
    "《登鹳雀楼》的作者是" is in countless pages that never saw the benchmark; with its answer
    after it, it is the item."""
    texts: dict[str, bool] = {}
    prompt, answers = _prompt(row), _answers(row)
    if isinstance(row.get("question"), str):
        prompt = row["question"]
        try:
            q = parse_question(row, "")
            texts.update((c, False) for c in q.choices)  # the gold one too: a choice alone
            texts[f"{prompt} {q.choices[q.answer]}"] = True
            answers = []
        except UserError:  # a question without usable choices: its question is still an item
            pass
    texts[prompt] = False
    for a in answers:
        texts[a] = texts[f"{prompt} {a}" if prompt else a] = True
    if isinstance(row.get("text"), str):
        texts[row["text"]] = True
    return {t: short for t, short in texts.items() if t and t.strip()}


def _prompt(row: dict) -> str:
    if isinstance(row.get("prompt"), str):
        return row["prompt"]
    messages = row.get("messages")
    if isinstance(messages, list):
        return "\n".join(m["content"] for m in messages if isinstance(m, dict)
                         and m.get("role") != "assistant" and isinstance(m.get("content"), str))
    return ""


def _answers(row: dict) -> list[str]:
    out = [r for r in row.get("references") or [] if isinstance(r, str)] \
        if isinstance(row.get("references"), list) else []
    out += [row[k] for k in _ANSWER_KEYS if isinstance(row.get(k), str)]
    messages = row.get("messages")
    if isinstance(messages, list):
        out += [m["content"] for m in messages if isinstance(m, dict)
                and m.get("role") == "assistant" and isinstance(m.get("content"), str)]
    return out


# -- the index ----------------------------------------------------------------------------------------

@dataclass
class FileIndexStats:
    """What one evaluation file gave the index."""
    path: str
    identity: dict  # {"sha256": …} of a file, {"fingerprint": …} of a workspace dataset
    rows: int = 0
    items_indexed: int = 0
    ngrams: int = 0
    skipped: dict = field(default_factory=dict)  # reason -> rows

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


@dataclass
class EvalIndex:
    """The n-grams of the evaluation files: `find` returns where each text contains one."""
    prefix_keys: np.ndarray
    prefix_values: np.ndarray
    gram_keys: np.ndarray
    gram_values: np.ndarray  # item number: an index into `items`
    widths: np.ndarray
    prefix: int
    items: list  # (file label, row number from 1)
    files: dict  # label -> FileIndexStats
    template_ngrams: int  # n-grams dropped as text shared by other items

    def label(self, item: int) -> str:
        name, row = self.items[item]
        return f"{name}:{row}"

    def find(self, texts: list[str], first_only: bool):
        """(text index, item, [start, stop) in code points) of every match (first_only: the
        first of each text), in text order."""
        tokens = tokenize(texts)
        return kernels().find_matches(tokens.hashes, tokens.starts, tokens.stops,
                                      tokens.offsets, self.prefix_keys, self.prefix_values,
                                      self.gram_keys, self.gram_values, self.widths,
                                      self.prefix, first_only)


def file_label(spec: str) -> str:
    """How `contaminated_by` names an evaluation file: its file name, or a dataset's name."""
    return Path(spec).name


def file_identity(art) -> dict:
    """What identifies an evaluation input's content wherever it is copied: a file's SHA-256,
    a workspace dataset's fingerprint."""
    if art.stage != "file":
        return {"fingerprint": art.fingerprint}
    digest = hashlib.sha256()
    with open(art.path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"sha256": digest.hexdigest()}


def build_index(specs: list[str], cfg) -> EvalIndex:
    """The index of the evaluation files or datasets `specs` (absolute paths); `cfg` a
    DecontamConfig. A file none of whose rows can be indexed is a UserError."""

    texts, owners, short_ok, items, files = [], [], [], [], {}
    for spec in specs:
        art = eval_input(Workspace(Path(spec).parent), spec)
        label = file_label(spec)
        if label in files:
            raise UserError(f"decontaminate: two evaluation inputs are named {label!r}; "
                            "rename one, so that `contaminated_by` tells them apart")
        stats = files[label] = FileIndexStats(str(art.path), file_identity(art))
        for n, row in enumerate(read_rows(art), 1):
            stats.rows += 1
            row_texts = item_texts(row) if isinstance(row, dict) else []
            if not row_texts:
                stats.skip("no text")
            elif sum(map(len, row_texts)) > cfg.max_item_chars:
                stats.skip("longer than max_item_chars")
            else:
                owners += [len(items)] * len(row_texts)
                texts += row_texts
                short_ok += row_texts.values()
                items.append((label, n))
    return _index_of(texts, np.array(owners, np.int64), np.array(short_ok, bool), items,
                     files, cfg)


def _index_of(texts, owners, short_ok, items, files, cfg) -> EvalIndex:
    k = kernels()
    tokens = tokenize(texts)
    prefix = min(cfg.min_words, cfg.min_chars)
    grams, firsts, segment, starts, info = k.segment_grams(
        tokens.hashes, tokens.unsegmented, tokens.offsets, cfg.ngram_words, cfg.ngram_chars,
        cfg.min_words, cfg.min_chars, cfg.cjk_ratio, prefix)
    info[~short_ok & (info[:, 1] < info[:, 2]), 1] = 0  # a question alone, shorter than n
    same = first_equal_item(tokens, owners, len(items))
    own = np.concatenate([[0], np.cumsum(~shared_tokens(tokens, owners, same, items, cfg))])
    width = info[segment, 1]
    # evidence: an n-gram with at least min_words (min_chars) tokens of its item's own,
    # so that text shared with other items, plus a word or two, is not a leak
    evidence = (width > 0) & (own[starts + width] - own[starts] >= info[segment, 3])
    candidates = len(np.unique(grams[width > 0]))
    grams, firsts, segment, width = (a[evidence] for a in (grams, firsts, segment, width))
    _count_items(files, items, owners, info, owners[segment])
    _require_items(files, cfg)
    # one row per (n-gram, distinct item); an n-gram in too many items is template, not evidence
    pairs = np.unique(np.stack([grams, same[owners[segment]].astype(np.uint64)]), axis=1)
    keys, first, per_key = np.unique(pairs[0], return_index=True, return_counts=True)
    keep = per_key <= cfg.max_items_per_ngram
    gram_keys, gram_values = k.build_table(keys[keep], pairs[1][first][keep].astype(np.int64))
    used = np.isin(grams, keys[keep])
    prefixes = np.unique(firsts[used])
    prefix_keys, prefix_values = k.build_table(prefixes, np.zeros(len(prefixes), np.int64))
    widths = np.unique(width[used]).astype(np.int64)
    return EvalIndex(prefix_keys, prefix_values, gram_keys, gram_values, widths, prefix, items,
                     files, candidates - int(keep.sum()))


def first_equal_item(tokens: Tokens, owners: np.ndarray, n_items: int) -> np.ndarray:
    """Per item, the first item whose texts fold to the same tokens: a row repeated in a file
    (or in another file) is one item, named by its first row."""
    texts_of = [[] for _ in range(n_items)]
    bounds = tokens.offsets
    for text, item in enumerate(owners.tolist()):
        texts_of[item].append(tokens.hashes[bounds[text]:bounds[text + 1]].tobytes())
    first: dict = {}
    return np.array([first.setdefault(tuple(sorted(t)), i) for i, t in enumerate(texts_of)],
                    np.int64)


def shared_tokens(tokens: Tokens, owners, same, items, cfg) -> np.ndarray:
    """Per token, whether it lies in a run of min_words words (min_chars characters) that two
    distinct items of one file share: an instruction, a template, a passage several questions
    ask about. GPT-3 and lm-eval-harness ignore n-grams frequent across the evaluation set
    for the same reason: such text shows the benchmark's format, not one of its items."""
    grams, _, segment, starts, info = kernels().segment_grams(
        tokens.hashes, tokens.unsegmented, tokens.offsets, cfg.min_words, cfg.min_chars,
        cfg.min_words, cfg.min_chars, cfg.cjk_ratio, min(cfg.min_words, cfg.min_chars))
    labels = {label: n for n, label in enumerate(dict.fromkeys(label for label, _ in items))}
    file_of = np.array([labels[label] for label, _ in items], np.uint64)
    in_file = grams ^ (file_of[owners[segment]] * np.uint64(0x9E3779B97F4A7C15))  # run, file
    pairs = np.unique(np.stack([in_file, same[owners[segment]].astype(np.uint64)]), axis=1)
    keys, per_key = np.unique(pairs[0], return_counts=True)
    shared = np.isin(in_file, keys[per_key > 1])
    edges = np.zeros(len(tokens.hashes) + 1, np.int64)
    np.add.at(edges, starts[shared], 1)
    np.add.at(edges, starts[shared] + info[segment[shared], 1], -1)
    return np.cumsum(edges[:-1]) > 0


def _count_items(files, items, owners, info, item_of_gram) -> None:
    """Per file: items indexed, n-grams, and items skipped: every text too short, or what is
    long enough shared with other items of the file."""
    indexable = np.zeros(len(items), bool)
    np.logical_or.at(indexable, owners, info[:, 1] > 0)
    grams_per_item = np.bincount(item_of_gram, minlength=len(items))
    for item, (label, _) in enumerate(items):
        stats = files[label]
        if grams_per_item[item]:
            stats.items_indexed += 1
            stats.ngrams += int(grams_per_item[item])
        else:
            stats.skip("shared with other items" if indexable[item] else "too short")


def _require_items(files: dict, cfg) -> None:
    for label, stats in files.items():
        if not stats.items_indexed:
            why = ", ".join(f"{n} {reason}" for reason, n in sorted(stats.skipped.items()))
            raise UserError(
                f"decontaminate: nothing to index in {stats.path} ({stats.rows} rows: {why or 'none'}); "
                f"an item needs at least min_words={cfg.min_words} words (min_chars={cfg.min_chars} "
                "for Chinese) in a question, prompt, answer or text: lower them with --set, or "
                "leave the file out of --against")


_INDEXES: dict = {}


def index_for(cfg) -> EvalIndex:
    """The index of `cfg.against`, built once per process (and again if a file changes)."""
    key = (tuple(cfg.against), cfg.ngram_words, cfg.ngram_chars, cfg.min_words, cfg.min_chars,
           cfg.cjk_ratio, cfg.max_items_per_ngram, cfg.max_item_chars,
           tuple(_stamp(s) for s in cfg.against))
    if key not in _INDEXES:
        _INDEXES.clear()
        _INDEXES[key] = build_index(cfg.against, cfg)
    return _INDEXES[key]


def _stamp(spec: str):
    path = Path(spec)
    target = path / "manifest.json" if path.is_dir() else path
    try:
        st = target.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns
