"""Documents -> sets of 64-bit shingle hashes, a whole batch per call, compiled with numba.

A batch travels as Arrow's own UTF-8 buffers (one bytes array + row offsets), so no Python
runs per document or per shingle. Tokens are runs of word characters; every character of an
unsegmented script (Han, kana, Thai, Lao, Khmer, Myanmar) is a token of its own. Each
document picks its n-gram length by what it is made of: word n-grams when most tokens are
words, character n-grams when most are unsegmented characters (`mode` WORDS / CHARS).
Whitespace always separates tokens; punctuation (ASCII and the common Unicode punctuation
blocks) separates them too when `strip_punctuation` is on, and is part of the word otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from llmkit.errors import ConfigError

WORDS, CHARS = 0, 1
AUTO = -1  # per-document mode choice in `shingle_hashes(..., modes=...)`

# character classes
_SPACE, _PUNCT, _UNSEGMENTED, _WORD = 0, 1, 2, 3

# class of each ASCII byte: control/space, letters and digits, punctuation
_ASCII_CLASS = np.array([_SPACE if b <= 0x20 or b == 0x7F else
                         _WORD if chr(b).isalnum() else _PUNCT for b in range(128)], np.int8)
# 1 where an ASCII byte continues a word, when punctuation separates / when it does not
_ASCII_IN_WORD_STRIP = (_ASCII_CLASS == _WORD).astype(np.uint8)
_ASCII_IN_WORD_KEEP = (_ASCII_CLASS != _SPACE).astype(np.uint8)
_ASCII_LOWER = np.array([b + 32 if 0x41 <= b <= 0x5A else b for b in range(128)], np.uint8)
_ASCII_SAME = np.arange(128, dtype=np.uint8)

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_SHINGLE_PRIME = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class ShingleConfig:
    word_ngram: int = 3         # shingle = this many consecutive words (space-delimited text)
    char_ngram: int = 3         # shingle = this many consecutive characters (CJK, Thai…)
    lowercase: bool = True      # compare case-insensitively (full Unicode lowering)
    strip_punctuation: bool = True  # punctuation separates tokens instead of joining words
    cjk_ratio: float = 0.5      # a document is shingled by characters when at least this
    #                             share of its tokens are unsegmented-script characters
    cjk_tokens: str = "chars"   # "chars" (character n-grams) or "jieba" (segment into words
    #                             with jieba, then word n-grams; slower)

    def __post_init__(self):
        if self.word_ngram < 1 or self.char_ngram < 1:
            raise ConfigError(f"word_ngram and char_ngram must be ≥ 1, got "
                              f"{self.word_ngram} and {self.char_ngram}")
        if not 0.0 <= self.cjk_ratio <= 1.0:
            raise ConfigError(f"cjk_ratio must be in [0, 1], got {self.cjk_ratio}")
        if self.cjk_tokens not in ("chars", "jieba"):
            raise ConfigError(f"cjk_tokens must be 'chars' or 'jieba', got {self.cjk_tokens!r}")


@dataclass
class ShingleBatch:
    """Shingle hashes of n documents: document i owns hashes[offsets[i]:offsets[i+1]]."""

    hashes: np.ndarray   # uint64, with repeats (a set in meaning; MinHash ignores repeats)
    offsets: np.ndarray  # int64, n + 1
    modes: np.ndarray    # int8, WORDS or CHARS per document

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def of(self, i: int) -> np.ndarray:
        return self.hashes[self.offsets[i]:self.offsets[i + 1]]


def text_buffers(texts) -> tuple[np.ndarray, np.ndarray]:
    """(utf8 bytes uint8, offsets int64) of a pyarrow string array, list of str, or column.

    Zero-copy for a pyarrow array; nulls read as empty documents.
    """
    import pyarrow as pa

    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    if not isinstance(texts, pa.Array):
        texts = pa.array(texts, type=pa.string())
    if pa.types.is_large_string(texts.type):
        offset_type = np.int64
    elif pa.types.is_string(texts.type):
        offset_type = np.int32
    else:
        raise TypeError(f"expected a string column, got {texts.type}")
    n = len(texts)
    if n == 0:
        return np.zeros(0, np.uint8), np.zeros(1, np.int64)
    if texts.null_count:
        texts = texts.fill_null("")
    buffers = texts.buffers()
    offsets = np.frombuffer(buffers[1], offset_type)[texts.offset:texts.offset + n + 1]
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return data, offsets.astype(np.int64)


def lowercase(texts):
    """Unicode lower-casing of a whole pyarrow array in Arrow's C++ kernel."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(texts, (pa.Array, pa.ChunkedArray)):
        texts = pa.array(texts, type=pa.string())
    return pc.utf8_lower(texts)


def shingle_hashes(texts, cfg: ShingleConfig, modes=None) -> ShingleBatch:
    """Shingle hashes of a batch of documents (pyarrow string array or list of str).

    `modes`, if given, forces WORDS/CHARS per document (AUTO lets the document choose).
    """
    data, offsets = text_buffers(texts)
    if cfg.lowercase and not _ascii_only(data, offsets):
        # the kernel lowers ASCII itself; anything else takes Arrow's Unicode kernel
        texts = lowercase(texts)
        data, offsets = text_buffers(texts)
    n = len(offsets) - 1
    forced = np.full(n, AUTO, np.int8) if modes is None else np.asarray(modes, np.int8)
    if cfg.cjk_tokens == "jieba":
        return _jieba_shingles(texts, data, offsets, forced, cfg)
    hashes, out_offsets, chosen = _shingle_kernel(
        data, offsets, forced, cfg.word_ngram, cfg.char_ngram, cfg.strip_punctuation,
        cfg.cjk_ratio, cfg.lowercase)
    return ShingleBatch(hashes, out_offsets, chosen)


def _ascii_only(data: np.ndarray, offsets: np.ndarray) -> bool:
    return len(data) == 0 or int(data[offsets[0]:offsets[-1]].max(initial=0)) < 0x80


def _jieba_shingles(texts, data, offsets, forced, cfg: ShingleConfig) -> ShingleBatch:
    """CHARS documents are segmented by jieba, then shingled as words; others as usual."""
    import jieba
    import pyarrow as pa

    chosen = document_modes(data, offsets, cfg.strip_punctuation, cfg.cjk_ratio)
    chosen = np.where(forced == AUTO, chosen, forced).astype(np.int8)
    cjk = np.flatnonzero(chosen == CHARS)
    if len(cjk) == 0:
        hashes, out_offsets, chosen = _shingle_kernel(
            data, offsets, forced, cfg.word_ngram, cfg.char_ngram, cfg.strip_punctuation,
            cfg.cjk_ratio, cfg.lowercase)
        return ShingleBatch(hashes, out_offsets, chosen)
    as_list = texts.to_pylist() if hasattr(texts, "to_pylist") else list(texts)
    for i in cjk:
        as_list[i] = " ".join(jieba.lcut(as_list[i] or ""))
    data, offsets = text_buffers(pa.array(as_list, type=pa.string()))
    # every document is now space-delimited words; the batch remembers which were CJK
    hashes, out_offsets, _ = _shingle_kernel(
        data, offsets, np.full(len(chosen), WORDS, np.int8), cfg.word_ngram, cfg.char_ngram,
        cfg.strip_punctuation, cfg.cjk_ratio, cfg.lowercase, True)
    return ShingleBatch(hashes, out_offsets, chosen)


def document_modes(data, offsets, strip_punctuation: bool, cjk_ratio: float) -> np.ndarray:
    """WORDS or CHARS for each document, as `shingle_hashes` would choose."""
    return _modes_kernel(data, offsets, strip_punctuation, cjk_ratio)


# -- compiled kernels ----------------------------------------------------------------------

@njit(cache=True, inline="always")
def _decode(data, i, end):
    """(code point, byte length) at data[i]; an invalid byte decodes as itself, length 1."""
    b0 = np.int64(data[i])
    if b0 < 0x80:
        return b0, 1
    if b0 >= 0xF0 and i + 3 < end:
        return (((b0 & 0x07) << 18) | ((np.int64(data[i + 1]) & 0x3F) << 12)
                | ((np.int64(data[i + 2]) & 0x3F) << 6) | (np.int64(data[i + 3]) & 0x3F)), 4
    if b0 >= 0xE0 and i + 2 < end:
        return (((b0 & 0x0F) << 12) | ((np.int64(data[i + 1]) & 0x3F) << 6)
                | (np.int64(data[i + 2]) & 0x3F)), 3
    if b0 >= 0xC0 and i + 1 < end:
        return ((b0 & 0x1F) << 6) | (np.int64(data[i + 1]) & 0x3F), 2
    return b0, 1


@njit(cache=True, inline="always")
def _char_class(cp):
    if cp < 0x80:
        if cp <= 0x20 or cp == 0x7F:
            return _SPACE
        if (cp >= 0x30 and cp <= 0x39) or (cp >= 0x41 and cp <= 0x5A) or (
                cp >= 0x61 and cp <= 0x7A):
            return _WORD
        return _PUNCT
    if cp == 0x85 or cp == 0xA0 or cp == 0x1680 or (cp >= 0x2000 and cp <= 0x200B) or (
            cp >= 0x2028 and cp <= 0x2029) or cp == 0x202F or cp == 0x205F or cp == 0x3000 or (
            cp == 0xFEFF):
        return _SPACE
    if (cp >= 0x4E00 and cp <= 0x9FFF) or (cp >= 0x3400 and cp <= 0x4DBF) or (
            cp >= 0x3040 and cp <= 0x30FF) or (cp >= 0xF900 and cp <= 0xFAFF) or (
            cp >= 0x20000 and cp <= 0x3134F) or (cp >= 0x0E00 and cp <= 0x0EFF) or (
            cp >= 0x1780 and cp <= 0x17FF) or (cp >= 0x1000 and cp <= 0x109F) or (
            cp >= 0x31F0 and cp <= 0x31FF):
        return _UNSEGMENTED
    if (cp >= 0xA1 and cp <= 0xBF) or cp == 0xD7 or cp == 0xF7 or (
            cp >= 0x2010 and cp <= 0x2027) or (cp >= 0x2030 and cp <= 0x205E) or (
            cp >= 0x2190 and cp <= 0x23FF) or (cp >= 0x2500 and cp <= 0x27BF) or (
            cp >= 0x2E00 and cp <= 0x2E7F) or (cp >= 0x3001 and cp <= 0x303F) or (
            cp >= 0xFE10 and cp <= 0xFE6F) or (cp >= 0xFF01 and cp <= 0xFF0F) or (
            cp >= 0xFF1A and cp <= 0xFF20) or (cp >= 0xFF3B and cp <= 0xFF40) or (
            cp >= 0xFF5B and cp <= 0xFF65) or (cp >= 0x1F300 and cp <= 0x1FAFF):
        return _PUNCT
    return _WORD


@njit(cache=True, inline="always")
def fmix64(h):
    """MurmurHash3's finaliser: every input bit flips each output bit with p ≈ 1/2."""
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


@njit(cache=True)
def _tokenize(data, start, end, strip_punctuation, segmented, lower_ascii, tokens):
    """Token hashes of data[start:end] into `tokens`; returns (count, unsegmented count).
    `segmented`: unsegmented-script characters join words too (text already split by
    spaces, e.g. by jieba). `lower_ascii`: A–Z hash as a–z."""
    in_word_table = _ASCII_IN_WORD_STRIP if strip_punctuation else _ASCII_IN_WORD_KEEP
    lower_table = _ASCII_LOWER if lower_ascii else _ASCII_SAME
    count = 0
    unsegmented = 0
    h = _FNV_OFFSET
    in_word = False
    i = start
    while i < end:
        byte = data[i]
        if byte < 0x80 and in_word_table[byte]:
            # the common case, a run of ASCII word bytes: one tight loop, no decoding
            if not in_word:
                h = _FNV_OFFSET
                in_word = True
            while True:
                h = (h ^ np.uint64(lower_table[byte])) * _FNV_PRIME
                i += 1
                if i >= end:
                    break
                byte = data[i]
                if byte >= 0x80 or not in_word_table[byte]:
                    break
            continue
        if byte < 0x80:
            cp, length, cls = np.int64(byte), 1, _ASCII_CLASS[byte]
        else:
            cp, length = _decode(data, i, end)
            cls = _char_class(cp)
        if (cls == _PUNCT and not strip_punctuation) or (cls == _UNSEGMENTED and segmented):
            cls = _WORD
        if cls == _WORD:
            if not in_word:
                h = _FNV_OFFSET
                in_word = True
            for k in range(i, i + length):
                h = (h ^ np.uint64(data[k])) * _FNV_PRIME
        else:
            if in_word:
                tokens[count] = fmix64(h)
                count += 1
                in_word = False
            if cls == _UNSEGMENTED:
                tokens[count] = fmix64(np.uint64(cp) * _FNV_PRIME + np.uint64(0x51ED27))
                count += 1
                unsegmented += 1
        i += length
    if in_word:
        tokens[count] = fmix64(h)
        count += 1
    return count, unsegmented


@njit(cache=True)
def _shingles_of_tokens(tokens, count, n, out, pos):
    """Hashes of the n-grams of tokens[:count] written at out[pos:]; returns the new pos.

    A document shorter than n tokens gives one shingle of all its tokens (as datatrove does),
    an empty one gives none.
    """
    if count == 0:
        return pos
    width = n if count >= n else count
    for s in range(count - width + 1):
        h = np.uint64(width)
        for t in range(s, s + width):
            h = (h ^ tokens[t]) * _SHINGLE_PRIME
            h ^= h >> np.uint64(29)
        out[pos] = fmix64(h)
        pos += 1
    return pos


@njit(cache=True)
def _shingle_kernel(data, offsets, forced, word_n, char_n, strip_punctuation, cjk_ratio,
                    lower_ascii, segmented=False):
    n_docs = len(offsets) - 1
    longest = 1
    for d in range(n_docs):
        longest = max(longest, offsets[d + 1] - offsets[d])
    tokens = np.empty(longest, np.uint64)
    out = np.empty(max(16, (offsets[n_docs] - offsets[0]) // 4), np.uint64)
    out_offsets = np.empty(n_docs + 1, np.int64)
    modes = np.empty(n_docs, np.int8)
    pos = 0
    out_offsets[0] = 0
    for d in range(n_docs):
        count, unsegmented = _tokenize(data, offsets[d], offsets[d + 1], strip_punctuation,
                                       segmented, lower_ascii, tokens)
        mode = forced[d]
        if mode < 0:
            mode = CHARS if count > 0 and unsegmented >= cjk_ratio * count else WORDS
        modes[d] = mode
        if pos + count + 1 > len(out):
            grown = np.empty(2 * len(out) + count + 1, np.uint64)
            grown[:pos] = out[:pos]
            out = grown
        pos = _shingles_of_tokens(tokens, count, char_n if mode == CHARS else word_n, out, pos)
        out_offsets[d + 1] = pos
    return out[:pos].copy(), out_offsets, modes


@njit(cache=True)
def _modes_kernel(data, offsets, strip_punctuation, cjk_ratio):
    n_docs = len(offsets) - 1
    longest = 1
    for d in range(n_docs):
        longest = max(longest, offsets[d + 1] - offsets[d])
    tokens = np.empty(longest, np.uint64)
    modes = np.empty(n_docs, np.int8)
    for d in range(n_docs):
        count, unsegmented = _tokenize(data, offsets[d], offsets[d + 1], strip_punctuation,
                                       False, False, tokens)
        modes[d] = CHARS if count > 0 and unsegmented >= cjk_ratio * count else WORDS
    return modes


def verification_sets(batch: ShingleBatch) -> tuple[np.ndarray, np.ndarray]:
    """(values uint32, lengths int64): each document's shingle hashes cut to 32 bits, for
    exact Jaccard of candidate pairs. 32 bits halve the storage; a chance collision between
    two ~300-shingle documents has probability ≈ 2e-5 and moves their Jaccard by one shingle."""
    return batch.hashes.astype(np.uint32), np.diff(batch.offsets)
