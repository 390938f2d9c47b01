"""Sentencepiece BPE tokenizer: training, exact encode/decode, a chunk-cache batch encoder, chat.

`decode(encode(x)) == x` for every string: normalisation is the identity, whitespace is kept
as is, and every character outside the vocabulary falls back to its UTF-8 bytes. The one
character sentencepiece cannot give back itself — its own whitespace mark "▁" (U+2581), which
it decodes as a space — is encoded here as its three bytes instead.

BPE pieces never span two places where no piece of the vocabulary joins the two characters
(a space after a non-space is one such place, by training with split_by_whitespace). Text
cut at those places encodes, chunk by chunk, to exactly sentencepiece's ids; the chunk-cache
encoder uses that to encode each distinct chunk once.

With `jieba=true` Chinese runs are first segmented into words by jieba, and pieces never
cross a word boundary (training marks the boundaries, encoding encodes word by word), so the
round trip stays exact.
"""

from __future__ import annotations

import heapq
import json
import logging
import re
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from llmkit.errors import ConfigError, UserError

MODEL_FILE = "tokenizer.model"
CONFIG_FILE = "tokenizer_config.json"


def same_tokenizer(dir_a, dir_b) -> bool:
    """Whether two tokenizer folders hold the same sentencepiece model, i.e. the same ids."""
    return (Path(dir_a) / MODEL_FILE).read_bytes() == (Path(dir_b) / MODEL_FILE).read_bytes()

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
END_OF_TURN = "<|end|>"
# A turn is `<|role|>content<|end|>`; the tokenizer adds <s> before the first one. Matches
# `Tokenizer.format_chat`, for transformers' apply_chat_template after export.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + "
    "'<|end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")

WS_MARK = "\u2581"        # sentencepiece's whitespace symbol "▁"
UNK_MARK = "\u2585"       # sentencepiece skips training sentences that contain it
TAB = "\t"                # never inside a trained piece: marks pretokenisation boundaries
MIN_COVERAGE = 0.98       # the lowest character_coverage sentencepiece accepts
N_BYTE_PIECES = 256
HAN_RUN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


@dataclass
class TokenizerConfig:
    vocab_size: int = 32000             # pieces, including special tokens and the 256 bytes
    character_coverage: float = 0.9995  # share of characters kept as pieces; rarer: bytes
    input_sentence_size: int = 1_000_000  # at most this many training sentences (memory bound)
    max_sentence_chars: int = 4096      # documents are cut at newlines into sentences this long
    jieba: bool = False                 # segment Chinese with jieba before BPE
    extra_symbols: list[str] = field(default_factory=list)  # more never-split tokens
    heldout_fraction: float = 0.01      # documents kept out of training to measure fertility
    heldout_chars: int = 2_000_000      # at most this many held-out characters are measured
    seed: int = 0                       # picks the training sample and the held-out documents

    def __post_init__(self):
        if self.vocab_size < 300:
            raise ConfigError(f"vocab_size must be ≥ 300 (256 byte pieces + specials), "
                              f"got {self.vocab_size}")
        if not MIN_COVERAGE <= self.character_coverage <= 1.0:
            raise ConfigError(f"character_coverage must be in [{MIN_COVERAGE}, 1], "
                              f"got {self.character_coverage}")
        if self.input_sentence_size < 101:
            raise ConfigError(f"input_sentence_size must be > 100, got {self.input_sentence_size}")
        if self.max_sentence_chars < 16:
            raise ConfigError(f"max_sentence_chars must be ≥ 16, got {self.max_sentence_chars}")
        if not 0.0 <= self.heldout_fraction < 0.5:
            raise ConfigError(f"heldout_fraction must be in [0, 0.5), got {self.heldout_fraction}")
        reserved = {UNK, BOS, EOS, PAD, *ROLE_TOKENS.values(), END_OF_TURN}
        for s in self.extra_symbols:
            if not s or s in reserved or any(c.isspace() for c in s) or WS_MARK in s:
                raise ConfigError(f"extra_symbols: {s!r} must be non-empty, without whitespace, "
                                  "and not one of the built-in special tokens")

    @property
    def user_symbols(self) -> list[str]:
        return [*ROLE_TOKENS.values(), END_OF_TURN, *self.extra_symbols]


# -- jieba ----------------------------------------------------------------------------------

_jieba = None


def _jieba_cut():
    global _jieba
    if _jieba is None:
        import jieba

        jieba.setLogLevel(logging.WARNING)
        _jieba = jieba.Tokenizer()
    return _jieba


def jieba_boundaries(text: str) -> list[int]:
    """Offsets inside Chinese runs where jieba starts a new word (never at a run's edges)."""
    cuts = []
    for m in HAN_RUN.finditer(text):
        run = m.group()
        if len(run) < 2:
            continue
        words = list(_jieba_cut().cut(run, HMM=True))
        if "".join(words) != run:  # jieba never changes text, but exactness matters more
            continue
        pos = m.start()
        for w in words[:-1]:
            pos += len(w)
            cuts.append(pos)
    return cuts


def mark_jieba_boundaries(text: str) -> str:
    """`text` with a tab at every jieba word boundary: what sentencepiece trains on."""
    cuts = jieba_boundaries(text)
    if not cuts:
        return text
    bounds = [0, *cuts, len(text)]
    return TAB.join(text[a:b] for a, b in zip(bounds, bounds[1:]))


# -- the chunk-cache encoder ----------------------------------------------------------------

_PAIR_BITS = 22      # size of the hashed set of character pairs found inside pieces
_SLOT_BITS = 20      # slots of each chunk table (a new chunk may evict an old one)
_KEY_BYTES = 16      # a chunk whose code points fit in 16 bytes is its own key (exact)
_CACHED_CHARS = 64   # longer chunks are encoded every time, not kept
_CACHE_CHARS = 1 << 25  # characters kept before the cache starts over (memory bound)
_SPACE, _MARK = 0x20, 0x2581
_SMALL_BATCH_CHARS = 4096  # smaller batches go to sentencepiece directly


class _Grown:
    """A numpy array that grows by doubling; `data[:size]` is its content."""

    def __init__(self, dtype, capacity: int = 1 << 12):
        import numpy as np

        self.data = np.empty(capacity, dtype)
        self.size = 0

    def extend(self, values) -> int:
        """Append `values`; return the offset where they start."""
        import numpy as np

        start, end = self.size, self.size + len(values)
        if end > len(self.data):
            grown = np.empty(max(end, 2 * len(self.data)), self.data.dtype)
            grown[:start] = self.data[:start]
            self.data = grown
        self.data[start:end] = values
        self.size = end
        return start


def _segment_any(mask, starts, sizes):
    """For each segment [start, start + size) of a boolean array: is any element true?
    (A cumulative sum: numpy's reduceat is slow on many short segments.)"""
    import numpy as np

    before = np.concatenate([[0], np.cumsum(mask)])
    return before[starts + sizes] > before[starts]


def _repeat_ranges(starts, lengths):
    """Indices starts[0] .. starts[0]+lengths[0]-1, starts[1] .., concatenated."""
    import numpy as np

    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    return np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)


class ChunkCacheEncoder:
    """Encodes batches of texts to the ids sentencepiece gives, each distinct chunk only once.

    A batch is cut, with numpy, before every run of spaces (sentencepiece's words) and, next
    to non-ASCII characters, wherever no vocabulary piece holds the two neighbours (Chinese
    has no spaces; this cuts it into short chunks). Chunks are looked up in a direct-mapped
    table by a hash of their characters, and a hit counts only if the characters are the
    same, so ids never depend on the hash. Only the misses become Python strings, encoded by
    sentencepiece in one call. `jieba` also cuts Chinese runs at jieba's word boundaries (the
    hybrid tokenizer).
    """

    def __init__(self, sp, *, jieba: bool = False):
        import numpy as np

        self._np = np
        self._sp = sp
        self._jieba = jieba
        self._jieba_cache: dict[str, list[int]] = {}
        self._joinable = self._pair_table()
        self._literal_mark = [sp.piece_to_id(f"<0x{b:02X}>") for b in WS_MARK.encode("utf-8")]
        self._char_ids = self._single_characters()
        self._low_bits = np.array([(1 << n) - 1 for n in range(65)], np.uint64)  # masks
        self._powers = np.ones(0, np.uint64)  # of the chunk hash's base, modulo 2**64
        self._inverse_powers = np.ones(0, np.uint64)
        self._clear()

    def _clear(self) -> None:
        """Empty the cache; entries 0..len(char_ids) are the one-character pieces."""
        np = self._np
        self._packed_key = np.zeros((1 << _SLOT_BITS, 3), np.uint64)  # short chunks, exact
        self._packed_entry = np.full(1 << _SLOT_BITS, -1, np.int32)
        self._slot_hash = np.zeros(1 << _SLOT_BITS, np.uint32)   # longer ones, by hash
        self._slot_entry = np.full(1 << _SLOT_BITS, -1, np.int32)
        self._tokens = _Grown(np.int32)      # every entry's ids, concatenated
        self._chars = _Grown(np.uint32)      # every entry's characters, concatenated
        self._token_start, self._token_len = _Grown(np.int64), _Grown(np.int64)
        self._char_start, self._char_len = _Grown(np.int64), _Grown(np.int64)
        self._tokens.extend(self._char_ids)
        n = len(self._char_ids)
        self._token_start.extend(np.arange(n))
        self._token_len.extend(np.ones(n, np.int64))
        self._char_start.extend(np.zeros(n, np.int64))
        self._char_len.extend(np.zeros(n, np.int64))  # never matched by the hash lookup

    def _single_characters(self):
        """Piece ids of the characters that are pieces by themselves, and a table from
        code point to their entry (-1 for the others)."""
        np = self._np
        sp = self._sp
        chars, ids = [], []
        for i, p in enumerate(sp.id_to_piece(list(range(sp.get_piece_size())))):
            if len(p) == 1 and p != WS_MARK and not (
                    sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) or sp.is_unused(i)):
                chars.append(ord(p))
                ids.append(i)
        if sp.piece_to_id(WS_MARK) != sp.unk_id():
            chars.append(_SPACE)  # sentencepiece writes a space as its "▁" piece
            ids.append(sp.piece_to_id(WS_MARK))
        self._char_entry = np.full(0x110000, -1, np.int32)
        self._char_entry[chars] = np.arange(len(chars))
        return np.array(ids, np.int32)

    @property
    def cached_chunks(self) -> int:
        return self._token_len.size

    def _pair_table(self):
        """Hashed set of character pairs that occur inside some piece (collisions only cut less)."""
        np = self._np
        pieces = [p for p in self._sp.id_to_piece(list(range(self._sp.get_piece_size())))
                  if len(p) > 1]
        left = list(map(ord, chain.from_iterable(p[:-1] for p in pieces)))
        right = list(map(ord, chain.from_iterable(p[1:] for p in pieces)))
        table = np.zeros(1 << _PAIR_BITS, bool)
        table[self._pair_hash(np.array(left, np.uint32), np.array(right, np.uint32))] = True
        return table

    def _pair_hash(self, a, b):
        np = self._np
        with np.errstate(over="ignore"):
            h = (a * np.uint32(0x9E3779B1)) ^ (b * np.uint32(0x85EBCA77))
        return h >> np.uint32(32 - _PAIR_BITS)

    def encode(self, texts: Sequence[str]):
        """(ids of all texts concatenated as int32, number of ids of each text)."""
        np = self._np
        return self.encode_joined("".join(texts),
                                  np.fromiter(map(len, texts), np.int64, len(texts)))

    def encode_joined(self, joined: str, lengths):
        """`encode` of the texts that make up `joined`, `lengths` characters each."""
        np = self._np
        if self._chars.size > _CACHE_CHARS:
            self._clear()
        if not joined:
            return np.empty(0, np.int32), np.zeros(len(lengths), np.int64)
        # code points, then _KEY_BYTES zero characters: a key may read that far past a start
        ascii = joined.isascii()
        padded = np.frombuffer(joined.encode("ascii") + bytes(_KEY_BYTES) if ascii else
                               joined.encode("utf-32-le") + bytes(4 * _KEY_BYTES),
                               np.uint8 if ascii else np.uint32)
        cp = padded[:len(joined)]
        starts = self._chunk_starts(cp, joined, lengths)
        sizes = np.diff(np.append(starts, len(cp)))
        entries = np.full(len(starts), -1, np.int64)
        single = sizes == 1
        entries[single] = self._char_entry[cp[starts[single]]]
        other = np.flatnonzero(entries < 0)
        keys, packed = self._chunk_keys(padded, starts[other], sizes[other])
        entries[other] = self._lookup(cp, starts[other], sizes[other], keys, packed)
        missing = np.flatnonzero(entries[other] < 0)
        first_temporary = self._token_len.size
        if len(missing):
            entries[other[missing]], first_temporary = self._add(
                cp, joined, starts[other[missing]], sizes[other[missing]], keys[missing],
                packed[missing])
        token_counts = self._token_len.data[entries]
        ids = self._tokens.data[_repeat_ranges(self._token_start.data[entries], token_counts)]
        self._drop_from(first_temporary)
        token_ends = np.concatenate([[0], np.cumsum(token_counts)])
        doc_starts = np.cumsum(lengths) - lengths
        first_chunk = np.searchsorted(starts, np.append(doc_starts, len(cp)))
        return ids, np.diff(token_ends[first_chunk])

    def _chunk_starts(self, cp, joined: str, lengths):
        """Offsets where a chunk starts: places BPE cannot merge across (`cp`: the batch's
        code points)."""
        np = self._np
        wide_text = cp.dtype != np.uint8
        space = cp == _SPACE
        if wide_text:
            mark = cp == _MARK
            space |= mark
        cut = space[1:] & ~space[:-1]  # a run of spaces starts sentencepiece's next word
        if wide_text:  # cut where no piece joins the neighbours, next to non-ASCII
            cut |= mark[:-1] | mark[1:]  # a literal "▁" is a chunk of its own
            high = cp >= 0x80
            wide = np.flatnonzero(high[:-1] | high[1:])
            left, right = cp[wide], cp[wide + 1]
            left[space[wide]] = _MARK  # sentencepiece's view: a space is "▁"
            right[space[wide + 1]] = _MARK
            cut[wide] |= ~self._joinable[self._pair_hash(left, right)]
        doc_ends = np.cumsum(lengths)[:-1]
        cut[doc_ends[(doc_ends > 0) & (doc_ends < len(cp))] - 1] = True
        if self._jieba:
            for pos in self._jieba_cuts(joined, lengths):
                cut[pos - 1] = True
        return np.concatenate([[0], np.flatnonzero(cut) + 1])

    def _chunk_keys(self, padded, starts, sizes):
        """([n, 3] keys, whether each key is exact). A chunk that fits in 16 bytes — up to
        16 ASCII characters (as bytes) or 4 others (as code points) — is its own key: those
        bytes, zeros past its end, then its size and kind. A longer chunk's key is
        [hash, 0, size]: a lookup must confirm it by comparing characters."""
        np = self._np
        keys = np.empty((len(starts), 3), np.uint64)
        narrow = padded
        if padded.dtype == np.uint8:
            ascii = np.ones(len(starts), bool)
            keys[:, 2] = sizes
        else:
            ascii = ~_segment_any(padded[:-_KEY_BYTES] >= 0x80, starts, sizes)
            keys[:, 2] = sizes.astype(np.uint64) | (~ascii).astype(np.uint64) << np.uint64(32)
            self._pack(keys, padded, starts, sizes, ~ascii)
            narrow = padded.astype(np.uint8)  # exact for the ASCII chunks, used only there
        self._pack(keys, narrow, starts, sizes, ascii)
        packed = sizes <= np.where(ascii, _KEY_BYTES, _KEY_BYTES // 4)
        if not packed.all():
            long = np.flatnonzero(~packed)
            keys[long, 0] = self._chunk_hashes(padded, starts[long], sizes[long])
            keys[long, 1] = 0
        return keys, packed

    def _pack(self, keys, padded, starts, sizes, which) -> None:
        """Write the first 16 bytes of the chosen chunks (zeros past their end) in keys[:, :2]."""
        np = self._np
        # the 8 bytes starting at every byte of the buffer, as one (unaligned) uint64 each
        words = np.ndarray((padded.nbytes - 7,), np.uint64, buffer=padded, strides=(1,))
        rows = np.flatnonzero(which)
        first_byte = starts[rows] * padded.itemsize
        valid_bits = sizes[rows] * (8 * padded.itemsize)
        for w in (0, 1):
            keys[rows, w] = words[first_byte + 8 * w] & self._low_bits[
                np.clip(valid_bits - 64 * w, 0, 64)]

    def _chunk_hashes(self, cp, starts, sizes):
        """A polynomial hash of each given chunk's characters."""
        np = self._np
        chars = cp[_repeat_ranges(starts, sizes)]
        powers, inverse = self._powers_upto(len(chars))
        first = np.cumsum(sizes) - sizes
        with np.errstate(over="ignore"):
            prefix = np.cumsum(np.multiply(chars, powers, dtype=np.uint64))
            before = np.where(first > 0, prefix[np.maximum(first - 1, 0)], np.uint64(0))
            h = (prefix[first + sizes - 1] - before) * inverse[first]
            return (h + sizes.astype(np.uint64)) * np.uint64(0x9E3779B97F4A7C15)

    def _powers_upto(self, n: int):
        np = self._np
        if len(self._powers) < n:
            size = max(n, 2 * len(self._powers), 1 << 16)
            base = 0x100000001B3  # odd, so invertible modulo 2**64
            with np.errstate(over="ignore"):
                up = np.cumprod(np.full(size, base, np.uint64))
                down = np.cumprod(np.full(size, pow(base, -1, 2 ** 64), np.uint64))
            self._powers = np.concatenate([[np.uint64(1)], up[:-1]])
            self._inverse_powers = np.concatenate([[np.uint64(1)], down[:-1]])
        return self._powers[:n], self._inverse_powers

    def _lookup(self, cp, starts, sizes, keys, packed):
        """The cached entry of every chunk, -1 for those not cached."""
        np = self._np
        out = np.full(len(keys), -1, np.int64)
        exact = np.flatnonzero(packed)
        slots = self._slot(keys[exact])
        for way in (0, 1):  # a key sits in the first slot of its pair, or else the second
            wanted, kept = keys[exact], self._packed_key[slots ^ way]
            hit = ((kept[:, 0] == wanted[:, 0]) & (kept[:, 1] == wanted[:, 1])
                   & (kept[:, 2] == wanted[:, 2]))
            out[exact[hit]] = self._packed_entry[slots[hit] ^ way]
            exact, slots = exact[~hit], slots[~hit]
        hashed = np.flatnonzero(~packed)
        if len(hashed):
            out[hashed] = self._lookup_hashed(cp, starts[hashed], sizes[hashed],
                                              keys[hashed, 0])
        return out

    def _lookup_hashed(self, cp, starts, sizes, keys):
        """Entries of longer chunks: a hit counts only if the characters are the same, so
        ids never depend on the hash."""
        np = self._np
        slots = self._slot(keys)
        entries = self._slot_entry[slots].astype(np.int64)
        hit = (self._slot_hash[slots] == keys.astype(np.uint32)) & (entries >= 0)
        hit[hit] = self._char_len.data[entries[hit]] == sizes[hit]
        found = np.flatnonzero(hit)
        if len(found):
            n = sizes[found]
            where = _repeat_ranges(starts[found], n)
            kept = self._chars.data[_repeat_ranges(self._char_start.data[entries[found]], n)]
            differs = _segment_any(cp[where] != kept, np.cumsum(n) - n, n)
            hit[found[differs]] = False
        return np.where(hit, entries, -1)

    def _mix(self, keys):
        """One 64-bit hash of each key ([n] hashes or [n, 3] keys)."""
        np = self._np
        with np.errstate(over="ignore"):
            if keys.ndim == 2:
                keys = (keys[:, 0] ^ (keys[:, 1] * np.uint64(0xC2B2AE3D27D4EB4F))
                        ^ (keys[:, 2] * np.uint64(0x165667B19E3779F9)))
            return keys * np.uint64(0x9E3779B97F4A7C15)

    def _slot(self, keys):
        """Table slot of each key ([n] hashes or [n, 3] keys)."""
        return (self._mix(keys) >> self._np.uint64(64 - _SLOT_BITS)).astype(self._np.int64)

    def _add(self, cp, joined: str, starts, sizes, keys, packed):
        """Encode the missing chunks, one per distinct key, and cache the short ones.
        Returns every chunk's entry and the first entry that is temporary (dropped after
        the batch)."""
        np = self._np
        _, reps, occurrence_of = np.unique(self._mix(keys), return_index=True,
                                           return_inverse=True)
        twin = reps[occurrence_of]  # the chunk that stands for each one (itself, mostly)
        long = sizes[reps] > _CACHED_CHARS
        order = np.argsort(long, kind="stable")  # cached entries first, temporary ones last
        reps, rank = reps[order], np.argsort(order)
        chunks = [joined[a:a + n] for a, n in zip(starts[reps].tolist(), sizes[reps].tolist())]
        first = self._append(self._encode_chunks(chunks),
                             cp[_repeat_ranges(starts[reps], sizes[reps])], sizes[reps])
        cached = int((~long).sum())
        new_entries = np.arange(first, first + cached)
        exact, kept_keys = packed[reps[:cached]], keys[reps[:cached]]
        slots = self._slot(kept_keys[exact])
        taken = self._packed_entry[slots] >= 0
        slots[taken] ^= 1  # the other way of the pair (evicting what is there)
        self._packed_key[slots] = kept_keys[exact]
        self._packed_entry[slots] = new_entries[exact]
        slots = self._slot(kept_keys[~exact, 0])
        self._slot_hash[slots] = kept_keys[~exact, 0].astype(np.uint32)
        self._slot_entry[slots] = new_entries[~exact]
        entries = first + rank[occurrence_of]
        # a chunk whose hash equals another's but which differs: encode it alone. Exact keys
        # compare whole; hashed ones (long chunks) by their characters
        differs = ~(keys == keys[twin]).all(axis=1)
        check = np.flatnonzero(~differs & ~packed & (twin != np.arange(len(twin))))
        if len(check):
            n = sizes[check]
            differs[check] = _segment_any(
                cp[_repeat_ranges(starts[check], n)]
                != cp[_repeat_ranges(starts[twin[check]], n)], np.cumsum(n) - n, n)
        for i in np.flatnonzero(differs).tolist():
            chunk = joined[starts[i]:starts[i] + sizes[i]]
            entries[i] = self._append(self._encode_chunks([chunk]),
                                      cp[starts[i]:starts[i] + sizes[i]], sizes[i:i + 1])
        return entries, first + cached

    def _encode_chunks(self, chunks: list[str]) -> list[list[int]]:
        encoded = self._sp.encode(chunks, num_threads=1)
        if WS_MARK in chunks:  # sentencepiece decodes it as a space: keep its bytes instead
            encoded[chunks.index(WS_MARK)] = self._literal_mark
        return encoded

    def _append(self, encoded: list[list[int]], chars, sizes) -> int:
        """Add entries (ids and characters); return the first one's number."""
        np = self._np
        lens = np.fromiter(map(len, encoded), np.int64, len(encoded))
        first = self._token_len.size
        start = self._tokens.extend(np.fromiter(chain.from_iterable(encoded), np.int32,
                                                int(lens.sum())))
        self._token_start.extend(start + np.cumsum(lens) - lens)
        self._token_len.extend(lens)
        start = self._chars.extend(chars)
        self._char_start.extend(start + np.cumsum(sizes) - sizes)
        self._char_len.extend(sizes)
        return first

    def _drop_from(self, entry: int) -> None:
        if entry < self._token_len.size:
            self._tokens.size = int(self._token_start.data[entry])
            self._chars.size = int(self._char_start.data[entry])
            for g in (self._token_start, self._token_len, self._char_start, self._char_len):
                g.size = entry

    def _jieba_cuts(self, joined: str, lengths) -> list[int]:
        """Offsets in the joined batch where jieba starts a word inside a Chinese run."""
        out = []
        ends = self._np.cumsum(lengths).tolist()
        for start, end in zip([0] + ends[:-1], ends):
            for m in HAN_RUN.finditer(joined, start, end):
                run = m.group()
                cuts = self._jieba_cache.get(run)
                if cuts is None:
                    cuts = jieba_boundaries(run)
                    if len(self._jieba_cache) < 1 << 20:
                        self._jieba_cache[run] = cuts
                out += [m.start() + c for c in cuts]
        return out


# -- the tokenizer --------------------------------------------------------------------------

class Tokenizer:
    """A trained tokenizer artifact (`tokenizer.model` + `tokenizer_config.json`)."""

    def __init__(self, directory: str | Path):
        import sentencepiece as spm

        self.path = Path(directory)
        model, cfg = self.path / MODEL_FILE, self.path / CONFIG_FILE
        if not model.is_file() or not cfg.is_file():
            raise UserError(f"{self.path} is not a tokenizer: it needs {MODEL_FILE} and "
                            f"{CONFIG_FILE}; build one with `llmkit tokenizer`")
        self.config = json.loads(cfg.read_text(encoding="utf-8"))
        self.sp = spm.SentencePieceProcessor(model_file=str(model))
        self.vocab_size = self.sp.get_piece_size()
        self.jieba = bool(self.config.get("jieba", False))
        self.unk_id, self.bos_id = self.sp.unk_id(), self.sp.bos_id()
        self.eos_id, self.pad_id = self.sp.eos_id(), self.sp.pad_id()
        self.role_ids = {r: self.sp.piece_to_id(t) for r, t in ROLE_TOKENS.items()}
        self.end_of_turn_id = self.sp.piece_to_id(END_OF_TURN)
        self._chunk_encoder = None

    @property
    def _encoder(self) -> ChunkCacheEncoder:
        if self._chunk_encoder is None:  # its tables take a moment: build on first use
            self._chunk_encoder = ChunkCacheEncoder(self.sp, jieba=self.jieba)
        return self._chunk_encoder

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        return cls(path)

    @property
    def stop_ids(self) -> list[int]:
        """Ids that end a generated reply."""
        return [self.end_of_turn_id, self.eos_id]

    @property
    def chat_template(self) -> str:
        return self.config.get("chat_template", CHAT_TEMPLATE)

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, without <s> or </s>."""
        return self.encode_flat([text])[0].tolist()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        ids, counts = self.encode_flat(texts)
        ids = ids.tolist()
        out, pos = [], 0
        for n in counts.tolist():
            out.append(ids[pos:pos + n])
            pos += n
        return out

    def encode_flat(self, texts: Sequence[str]):
        """All texts' ids concatenated (int32 numpy array) and the number of ids of each."""
        import numpy as np

        if (not self.jieba and sum(map(len, texts)) < _SMALL_BATCH_CHARS
                and not any(WS_MARK in t for t in texts)):
            # a few short texts (a chat turn): sentencepiece directly costs less than setting
            # up the batch encoder's arrays, and gives the same ids
            encoded = self.sp.encode(list(texts))
            counts = np.fromiter(map(len, encoded), np.int64, len(encoded))
            return np.fromiter(chain.from_iterable(encoded), np.int32, int(counts.sum())), counts
        return self._encoder.encode(texts)

    def encode_joined(self, joined: str, lengths):
        """`encode_flat` of the texts that make up `joined`, `lengths` characters each."""
        return self._encoder.encode_joined(joined, lengths)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`; control tokens (<s>, </s>, <pad>) decode to nothing."""
        ids = ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids]
        return self.sp.decode(ids)

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))

    def piece_to_id(self, piece: str) -> int:
        return self.sp.piece_to_id(piece)

    # -- chat --------------------------------------------------------------------------------

    def format_chat(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
        """The chat as text (no <s>): `<|user|>Hi<|end|><|assistant|>Hello<|end|>`."""
        return "".join(ROLE_TOKENS[r] + c + END_OF_TURN for r, c in _turns(messages)) + (
            ROLE_TOKENS["assistant"] if add_generation_prompt else "")

    def encode_chat(self, messages: Sequence[dict], add_generation_prompt: bool = False):
        """(ids, loss_mask): <s> then each turn; the mask is 1 on assistant content and its
        <|end|>, the tokens an SFT model learns to produce. ids == [<s>] + encode(format_chat)."""
        turns = _turns(messages)
        contents = self.encode_batch([c for _, c in turns])
        ids, mask = [self.bos_id], [0]
        for (role, _), content in zip(turns, contents):
            learn = int(role == "assistant")
            ids += [self.role_ids[role], *content, self.end_of_turn_id]
            mask += [0, *([learn] * len(content)), learn]
        if add_generation_prompt:
            ids.append(self.role_ids["assistant"])
            mask.append(0)
        return ids, mask

    def save(self, directory: str | Path) -> None:
        """Copy the tokenizer's files into `directory` (checkpoints carry their tokenizer)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in (MODEL_FILE, CONFIG_FILE):
            shutil.copyfile(self.path / name, directory / name)


def _turns(messages: Sequence[dict]) -> list[tuple[str, str]]:
    turns = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        if role not in ROLE_TOKENS:
            raise UserError(f"message {i}: role must be one of {', '.join(ROLE_TOKENS)}, "
                            f"got {role!r}")
        if not isinstance(content, str):
            raise UserError(f"message {i} ({role}): content must be a string, got {content!r}")
        turns.append((role, content))
    return turns


# -- training -------------------------------------------------------------------------------

def _hash01(*parts) -> float:
    """A stable number in [0, 1) for the given values (sampling and held-out choices)."""
    import hashlib

    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8", "surrogatepass"),
                        digest_size=8)
    return int.from_bytes(h.digest(), "little") / 2.0 ** 64


def split_sentences(text: str, max_chars: int) -> list[str]:
    """`text` cut after newlines into pieces of at most `max_chars` (a longer line is cut)."""
    if len(text) <= max_chars:
        return [text] if text else []
    out, cur = [], ""
    for line in text.splitlines(keepends=True):
        while len(line) > max_chars:
            if cur:
                out.append(cur)
                cur = ""
            out.append(line[:max_chars])
            line = line[max_chars:]
        if len(cur) + len(line) > max_chars:
            out.append(cur)
            cur = ""
        cur += line
    if cur:
        out.append(cur)
    return out


class TrainingSample:
    """A bounded, order-independent sample of sentences (the `k` with the smallest hash)."""

    def __init__(self, k: int, seed: int):
        self.k, self.seed = k, seed
        self._heap: list[tuple[float, int, str]] = []
        self._n = 0
        self.sentences_seen = 0

    def add(self, doc_id: str, text: str, max_chars: int) -> None:
        for i, s in enumerate(split_sentences(text, max_chars)):
            if UNK_MARK in s:
                continue  # sentencepiece would skip it
            self.sentences_seen += 1
            key = -_hash01(self.seed, doc_id, i)
            self._n += 1
            item = (key, self._n, s)
            if len(self._heap) < self.k:
                heapq.heappush(self._heap, item)
            elif key > self._heap[0][0]:
                heapq.heapreplace(self._heap, item)

    def sentences(self) -> list[str]:
        return [s for _, _, s in sorted(self._heap, key=lambda t: (-t[0], t[1]))]


@dataclass
class CoveragePlan:
    requested: float      # the configured character_coverage
    used: float           # the coverage actually trained with (lower when the vocab is small)
    spm_value: float      # what sentencepiece is given (its own accounting of the text)
    required_chars: int   # distinct characters that become pieces
    byte_chars: int       # distinct characters of the sample left to byte fallback
    lowered: bool


def _sorted_counts(counts: Counter) -> list[tuple[str, int]]:
    # sentencepiece's order: most frequent first, ties by code point
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _required_chars(counts: Counter, coverage: float) -> int:
    """How many characters sentencepiece keeps at `coverage` (its float32 arithmetic)."""
    import numpy as np

    total = sum(counts.values())
    target, acc, n = np.float32(coverage), 0, 0
    for ch, c in _sorted_counts(counts):
        if np.float32(acc / total) >= target:
            break
        acc += c
        if ch != TAB:
            n += 1
    return n


def _coverage_keeping(counts: Counter, n_chars: int) -> float:
    """The coverage at which sentencepiece keeps the `n_chars` most frequent characters."""
    import numpy as np

    total, acc, n = sum(counts.values()), 0, 0
    for ch, c in _sorted_counts(counts):
        acc += c
        n += ch != TAB
        if n >= n_chars:
            return float(np.float32(acc / total))
    return 1.0


def plan_coverage(real: Counter, seen: Counter, cfg: TokenizerConfig,
                  spare: int = 0) -> CoveragePlan:
    """Pick the character coverage that fits the vocabulary, or say which vocabulary would.

    `real` counts the sample's characters; `seen` counts them as sentencepiece will (with
    jieba boundary marks); `spare` keeps that many pieces free. Raises UserError when even
    coverage 0.98 needs more pieces.
    """
    specials = 4 + len(cfg.user_symbols) + N_BYTE_PIECES
    budget = cfg.vocab_size - specials - spare
    wanted = _required_chars(real, cfg.character_coverage)
    if wanted <= budget:
        kept, used = wanted, cfg.character_coverage
    else:
        least = _required_chars(real, MIN_COVERAGE)
        if least > budget:
            raise UserError(
                f"vocab_size={cfg.vocab_size} is too small for this text: even at "
                f"character_coverage={MIN_COVERAGE} it needs {least} characters + {specials} "
                f"special and byte pieces. The smallest vocabulary that works is "
                f"{least + specials}: use --set vocab_size={least + specials} or larger")
        kept = budget
        total = sum(c for ch, c in real.items())
        used = sum(c for _, c in _sorted_counts(Counter(
            {ch: c for ch, c in real.items() if ch != TAB}))[:kept]) / total
        used = max(MIN_COVERAGE, min(cfg.character_coverage, used))
    spm_value = used if (seen == real and kept == wanted) else max(
        MIN_COVERAGE, _coverage_keeping(seen, kept))
    distinct = sum(1 for ch in real if ch != TAB)
    return CoveragePlan(cfg.character_coverage, used, spm_value, kept, distinct - kept,
                        kept < wanted)


def _spm_view(sentences: list[str], meta: list[str]) -> Counter:
    """Character counts as sentencepiece sees them: spaces are ▁, special tokens are tabs,
    and trailing line breaks are gone (its sentence reader strips them)."""
    counts: Counter = Counter()
    meta_re = re.compile("|".join(map(re.escape, sorted(meta, key=len, reverse=True))))
    for s in sentences:
        s = s.rstrip("\r\n")
        if "<" in s:
            s = meta_re.sub(TAB, s)
        counts.update(s)
    if " " in counts:
        counts[WS_MARK] += counts.pop(" ")
    counts.pop("\x00", None)
    return counts


def train_sentencepiece(sentences: list[str], cfg: TokenizerConfig, workers: int = 1,
                        log=print) -> tuple[bytes, CoveragePlan]:
    """Train the BPE model on `sentences`; returns the serialized model and the coverage used."""
    if not sentences:
        raise UserError("tokenizer: the input has no text to train on")
    meta = [UNK, BOS, EOS, PAD, *cfg.user_symbols] + [f"<0x{b:02X}>" for b in range(256)]
    real = _spm_view(sentences, meta)
    if cfg.jieba:
        sentences = [mark_jieba_boundaries(s) for s in sentences]
        seen = _spm_view(sentences, meta)
    else:
        seen = real
    spare = 0
    for attempt in range(3):
        plan = plan_coverage(real, seen, cfg, spare)
        try:
            model = _train_bpe(sentences, cfg, plan.spm_value, workers)
            break
        except RuntimeError as e:
            # our count of sentencepiece's alphabet is exact on every corpus we know; should
            # it ever be short, the error says by how much: keep that many more pieces free
            m = re.search(r"required_chars\. (\d+) vs (\d+)", str(e))
            if not m or attempt == 2:
                raise _user_error_of(e, cfg) from None
            spare += int(m.group(2)) - int(m.group(1))
    if plan.lowered:
        log(f"tokenizer: vocab_size={cfg.vocab_size} cannot hold the characters that "
            f"character_coverage={cfg.character_coverage} needs; lowered it to "
            f"{plan.used:.6f}, so {plan.byte_chars} rare characters fall back to UTF-8 bytes")
    return model, plan


def _train_bpe(sentences: list[str], cfg: TokenizerConfig, coverage: float,
               workers: int) -> bytes:
    import io

    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=out, model_type="bpe",
        vocab_size=cfg.vocab_size, character_coverage=coverage,
        byte_fallback=True, split_digits=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=False,
        allow_whitespace_only_pieces=True, split_by_whitespace=True,
        user_defined_symbols=cfg.user_symbols, unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        input_sentence_size=0, shuffle_input_sentence=False,
        max_sentence_length=4 * cfg.max_sentence_chars + 16,
        num_threads=max(1, min(workers, 128)), minloglevel=2)
    return out.getvalue()


def _user_error_of(e: RuntimeError, cfg: TokenizerConfig) -> Exception:
    msg = str(e)
    m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", msg)
    if m:
        return UserError(f"vocab_size={m.group(1)} is more than this text supports (at most "
                         f"{m.group(2)} pieces): use --set vocab_size={m.group(2)} or less, "
                         "or train on more text")
    m = re.search(r"required_chars\. (\d+) vs (\d+)", msg)
    if m:
        return UserError(f"vocab_size={m.group(1)} is too small for this text: it needs "
                         f"{m.group(2)}; use --set vocab_size={m.group(2)} or larger")
    return e


def tokenizer_config_json(cfg: TokenizerConfig, sp_model: bytes) -> dict:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=sp_model)
    special = {name: {"piece": p, "id": sp.piece_to_id(p)} for name, p in
               [("unk", UNK), ("bos", BOS), ("eos", EOS), ("pad", PAD)]
               + [(r, t) for r, t in ROLE_TOKENS.items()] + [("end_of_turn", END_OF_TURN)]
               + [(s, s) for s in cfg.extra_symbols]}
    return {
        "model_file": MODEL_FILE,
        "model_type": "sentencepiece-bpe",
        "vocab_size": sp.get_piece_size(),
        "special_tokens": special,
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK,
        "role_tokens": ROLE_TOKENS,
        "end_of_turn_token": END_OF_TURN,
        "chat_template": CHAT_TEMPLATE,
        "add_bos_token": True,
        "add_eos_token": False,
        "jieba": cfg.jieba,
        "byte_fallback": True,
        "normalization": "identity",
    }


# -- fertility ------------------------------------------------------------------------------

_WORDS = re.compile(r"\w+")


def language_of(text: str) -> str:
    """A rough language label from the script: zh, latin or other."""
    han = sum(len(r) for r in HAN_RUN.findall(text))
    letters = sum(1 for c in text if c.isalpha())
    if letters == 0:
        return "other"
    if han >= 0.3 * letters:
        return "zh"
    latin = sum(1 for c in text if c.isalpha() and ord(c) < 0x250)
    return "latin" if latin >= 0.5 * letters else "other"


def count_words(text: str, lang: str) -> int:
    if lang == "zh":
        return sum(1 for w in _jieba_cut().cut(text) if _WORDS.search(w))
    return len(_WORDS.findall(text))


def fertility(tok: Tokenizer, docs: list[tuple[str, str]]) -> tuple[dict, int]:
    """Tokens per character and per word by language on (lang, text) pairs, and the number
    of documents whose round trip failed (always 0 unless something is broken)."""
    by_lang: dict[str, dict] = {}
    failures = 0
    texts = [t for _, t in docs]
    for (lang, text), ids in zip(docs, tok.encode_batch(texts)):
        if tok.decode(ids) != text:
            failures += 1
        s = by_lang.setdefault(lang, {"docs": 0, "chars": 0, "words": 0, "tokens": 0})
        s["docs"] += 1
        s["chars"] += len(text)
        s["words"] += count_words(text, lang)
        s["tokens"] += len(ids)
    for s in by_lang.values():
        s["tokens_per_char"] = round(s["tokens"] / max(s["chars"], 1), 4)
        s["tokens_per_word"] = round(s["tokens"] / max(s["words"], 1), 4)
    return dict(sorted(by_lang.items())), failures


# -- the stage ------------------------------------------------------------------------------

def _documents(datasets) -> Iterator[tuple[str, str, str | None]]:
    """(id, text, lang) of every row of the input datasets."""
    import pyarrow.parquet as pq

    from llmkit.data.io import dataset_files

    for art in datasets:
        for f in dataset_files(art.path):
            names = pq.ParquetFile(f).schema_arrow.names
            if "text" not in names:
                raise UserError(f"{f} has no `text` column; the tokenizer trains on text")
            cols = ["text"] + [c for c in ("id", "lang") if c in names]
            for batch in pq.ParquetFile(f).iter_batches(batch_size=4096, columns=cols):
                d = batch.to_pydict()
                n = batch.num_rows
                ids = d.get("id") or [f"{f.name}:{i}" for i in range(n)]
                langs = d.get("lang") or [None] * n
                for i, t, lang in zip(ids, d["text"], langs):
                    if t:
                        yield str(i), t, lang


def run_tokenizer(ctx, cfg: TokenizerConfig):
    """`llmkit tokenizer`: train on the input dataset(s) and write the tokenizer artifact."""
    from llmkit.progress import Progress, print_summary
    from llmkit.workspace import write_atomic

    datasets = ctx.input_list("dedup")
    b = ctx.workspace.builder(ctx.out_name("tokenizer"), stage="tokenizer", config=cfg,
                              inputs=datasets, force=ctx.force)
    if b.up_to_date:
        return b
    with b:
        sample = TrainingSample(cfg.input_sentence_size, cfg.seed)
        heldout: list[tuple[str, str]] = []
        heldout_chars = docs = 0
        with Progress("tokenizer: sampling", unit="docs") as bar:
            for doc_id, text, lang in _documents(datasets):
                docs += 1
                bar.advance(1)
                if _hash01("heldout", cfg.seed, doc_id) < cfg.heldout_fraction:
                    if heldout_chars < cfg.heldout_chars:
                        heldout.append((lang or language_of(text), text))
                        heldout_chars += len(text)
                    continue
                sample.add(doc_id, text, cfg.max_sentence_chars)
        sentences = sample.sentences()
        started = time.time()
        model, plan = train_sentencepiece(sentences, cfg, ctx.workers)
        train_seconds = time.time() - started
        (b.dir / MODEL_FILE).write_bytes(model)
        write_atomic(b.dir / CONFIG_FILE, json.dumps(tokenizer_config_json(cfg, model),
                                                      indent=2, ensure_ascii=False))
        tok = Tokenizer(b.dir)
        fert, failures = fertility(tok, heldout)
        if failures:  # a bug, never a user error
            raise AssertionError(f"tokenizer: {failures} held-out documents do not round-trip")
        b.stats.update(
            vocab_size=tok.vocab_size, docs=docs, sample_sentences=len(sentences),
            sample_chars=sum(map(len, sentences)), sentences_seen=sample.sentences_seen,
            character_coverage=plan.requested, character_coverage_used=round(plan.used, 6),
            coverage_lowered=plan.lowered, required_chars=plan.required_chars,
            byte_fallback_chars=plan.byte_chars, jieba=cfg.jieba,
            heldout_docs=len(heldout), fertility=fert, roundtrip_failures=failures,
            train_seconds=round(train_seconds, 2))
    rows = [("vocab size", b.stats["vocab_size"]), ("sample sentences", len(sentences)),
            ("coverage used", f"{plan.used:.6g}")]
    rows += [(f"{lang} tokens/char", s["tokens_per_char"]) for lang, s in fert.items()]
    rows.append(("seconds", round(time.time() - b.started, 2)))
    print_summary(f"{b.name} done", rows)
    return b
