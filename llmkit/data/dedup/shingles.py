"""Documents -> sets of 64-bit shingle hashes, a whole batch per compiled call.

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

from llmkit.data.arrow import string_buffers
from llmkit.data.dedup.compiled import kernels
from llmkit.errors import ConfigError

WORDS, CHARS = 0, 1
AUTO = -1  # per-document mode choice in `shingle_hashes(..., modes=...)`


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
    data, offsets = string_buffers(texts)
    if cfg.lowercase and not _ascii_only(data, offsets):
        # the kernel lowers ASCII itself; anything else takes Arrow's Unicode kernel
        texts = lowercase(texts)
        data, offsets = string_buffers(texts)
    n = len(offsets) - 1
    forced = np.full(n, AUTO, np.int8) if modes is None else np.asarray(modes, np.int8)
    if cfg.cjk_tokens == "jieba":
        return _jieba_shingles(texts, data, offsets, forced, cfg)
    return _shingle_batch(data, offsets, forced, cfg)


def _shingle_batch(data, offsets, forced, cfg: ShingleConfig, segmented: bool = False):
    hashes, out_offsets, chosen = kernels().shingles(
        data, offsets, forced, cfg.word_ngram, cfg.char_ngram, cfg.strip_punctuation,
        cfg.cjk_ratio, cfg.lowercase, segmented)
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
        return _shingle_batch(data, offsets, forced, cfg)
    as_list = texts.to_pylist() if hasattr(texts, "to_pylist") else list(texts)
    for i in cjk:
        as_list[i] = " ".join(jieba.lcut(as_list[i] or ""))
    data, offsets = string_buffers(pa.array(as_list, type=pa.string()))
    # every document is now space-delimited words; the batch remembers which were CJK
    batch = _shingle_batch(data, offsets, np.full(len(chosen), WORDS, np.int8), cfg,
                           segmented=True)
    return ShingleBatch(batch.hashes, batch.offsets, chosen)


def document_modes(data, offsets, strip_punctuation: bool, cjk_ratio: float) -> np.ndarray:
    """WORDS or CHARS for each document, as `shingle_hashes` would choose."""
    return kernels().document_modes(data, offsets, strip_punctuation, cjk_ratio)


def verification_sets(batch: ShingleBatch) -> tuple[np.ndarray, np.ndarray]:
    """(values uint32, lengths int64): each document's shingle hashes cut to 32 bits, for
    exact Jaccard of candidate pairs. 32 bits halve the storage; a chance collision between
    two ~300-shingle documents has probability ≈ 2e-5 and moves their Jaccard by one shingle."""
    return batch.hashes.astype(np.uint32), np.diff(batch.offsets)
