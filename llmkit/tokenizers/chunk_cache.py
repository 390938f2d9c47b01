"""The chunk-cache batch encoder: sentencepiece's ids, each distinct chunk encoded once.

BPE pieces never span a place where no piece of the vocabulary joins the two characters
(llmkit.tokenizers.sentencepiece says why), so text cut at those places encodes chunk by chunk to exactly
sentencepiece's ids. One compiled pass over a batch's UTF-8 bytes finds the cuts, hashes each
chunk and looks it up in a table of the chunks seen before; sentencepiece encodes only the
chunks never seen, in one call; a second compiled pass writes the ids. A hit counts only if
the bytes are the same, so ids never depend on the hash.

The table is built for the memory hierarchy: a slot holds a short chunk's bytes, its hash
and its ids (one or two inline), so most chunks cost one cache line.

The passes (llmkit.tokenizers._chunk_kernels) are numba functions. Importing numba and loading them from
its cache costs a process over half a second — a fifth of a 24 MB `llmkit tokenize` — so the
first use compiles them ahead of time (llmkit.core.aot) into an extension module, which later
processes import without numba. Where that cannot be built (no C compiler), they run through
numba's JIT.
"""

from __future__ import annotations

import copy
import sys
from itertools import chain

import numpy as np

from llmkit.core import aot
from llmkit.tokenizers.cjk import HAN_RUN, jieba_boundaries

WS_MARK = "\u2581"       # sentencepiece's whitespace symbol "▁"
_MARK, _SPACE = 0x2581, 0x20
_PAIR_BITS = 22          # bits of the hashed set of character pairs found inside pieces
_CACHED_BYTES = 256      # longer chunks are encoded every time, never kept
_MIN_TABLE_BITS = 16     # slots of the chunk table at first (2 MB); it doubles as chunks come
_MAX_TABLE_BITS = 21     # at most 64 MB, of which 3/8 are used before the cache starts over
_KEPT_BYTES = 1 << 25    # bytes of long chunks kept before the cache starts over
_SEPARATOR = "\uffff"    # joins the missed chunks for one sentencepiece call: never merged
_BLOCK = 1024            # chunks cut before they are looked up together
_SHARED_CHUNKS = 1 << 19  # chunks whose ids sibling encoders share before starting over

# a slot: [first 8 bytes, next 8 bytes (or where a long chunk's bytes are kept), hash, info];
# info: size (9 bits), number of ids (10 bits), then the ids (two of 22 bits inline, or where
# they are kept), or, while a chunk new in this batch waits for its ids, its miss number
_W0, _W1, _HASH, _INFO = 0, 1, 2, 3
_SIZE_BITS, _LEN_BITS = 9, 10
_PENDING = (1 << _LEN_BITS) - 1
_INLINE_BITS = 22        # ids below 2**22 fit two to a slot
# state[] slots shared by the passes: chunks in the table, long-chunk bytes kept, ids kept,
# one-character chunks kept
_ENTRIES, _BYTES, _IDS, _SINGLE = 0, 1, 2, 3


class ChunkCacheEncoder:
    """Encodes batches of texts to the ids sentencepiece gives, each distinct chunk only once.

    `jieba` also cuts Chinese runs at jieba's word boundaries (the hybrid tokenizer). Not
    safe to share between threads: give each thread its own (they may share `sp`).
    `hash_mask` is for tests: 0 makes every chunk's hash collide.
    """

    def __init__(self, sp, *, jieba: bool = False, hash_mask: int = (1 << 64) - 1):
        if sp.get_piece_size() > 1 << _INLINE_BITS:
            raise ValueError(f"the chunk cache holds ids below {1 << _INLINE_BITS}")
        if sys.byteorder != "little":  # keys are bytes read as little-endian words
            raise NotImplementedError("the chunk-cache encoder needs a little-endian machine")
        self._sp = sp
        self._jieba = jieba
        self._jieba_cache: dict[str, list[int]] = {}
        self._joinable, self._sides = self._pair_table()
        self._literal_mark = [sp.piece_to_id(f"<0x{b:02X}>") for b in WS_MARK.encode("utf-8")]
        self._separator_ids = [sp.piece_to_id(f"<0x{b:02X}>")
                               for b in _SEPARATOR.encode("utf-8")]
        # the separator must come out as its bytes (no piece holds it) for the joined call
        self._join_misses = sp.encode(_SEPARATOR + "a" + _SEPARATOR) == (
            self._separator_ids + sp.encode("a") + self._separator_ids)
        self._hash_mask = np.uint64(hash_mask)
        self._shared: dict[str, list[int]] | None = None  # chunk -> ids, with siblings
        self._work = None  # see _work_arrays
        self._clear(_MIN_TABLE_BITS)

    def _clear(self, table_bits: int) -> None:
        self._table = np.zeros((1 << table_bits, 4), np.uint64)
        self._kept = np.zeros(1 << 16, np.uint8)   # long chunks' bytes, concatenated
        self._ids = np.zeros(1 << 16, np.int32)    # ids of chunks of three or more
        self._char_info = np.zeros(0x110000, np.uint64)  # one-character chunks' info
        self._state = np.zeros(4, np.int64)

    def _pair_table(self):
        """Hashed set of character pairs that occur inside some piece (collisions only cut
        less), and which side of such a pair each character is ever on."""
        sp = self._sp
        pieces = [p for p in sp.id_to_piece(list(range(sp.get_piece_size()))) if len(p) > 1]
        left = np.array(list(map(ord, chain.from_iterable(p[:-1] for p in pieces))), np.int64)
        right = np.array(list(map(ord, chain.from_iterable(p[1:] for p in pieces))), np.int64)
        table = np.zeros(1 << (_PAIR_BITS - 6), np.uint64)  # a bitset: it stays in cache
        kernels().mark_pairs(table, left, right)
        sides = np.zeros(0x110000, np.uint8)  # see cut_and_look_up
        sides[left] |= 1
        sides[right] |= 2
        return table, sides

    @property
    def cached_chunks(self) -> int:
        return int(self._state[_ENTRIES] + self._state[_SINGLE])

    def encode(self, texts):
        """(ids of all texts concatenated as int32, number of ids of each text)."""
        return self.encode_joined("".join(texts),
                                  np.fromiter(map(len, texts), np.int64, len(texts)))

    def encode_joined(self, joined: str, lengths):
        """`encode` of the texts that make up `joined`, `lengths` characters each."""
        char_ends = np.cumsum(lengths, dtype=np.int64)
        data = joined.encode("utf-8")
        if len(data) == len(joined):
            return self._encode(data, char_ends, -1, joined)
        lead = np.flatnonzero((np.frombuffer(data, np.uint8) & 0xC0) != 0x80)
        return self._encode(data, np.append(lead, len(data))[char_ends], -1, joined)

    def encode_utf8(self, data, ends, end_id: int = -1):
        """`encode` of the texts whose UTF-8 bytes make up `data`, the i-th ending at byte
        ends[i]; with `end_id` ≥ 0, that id follows each text (and counts in its length)."""
        return self._encode(data, np.asarray(ends, np.int64), end_id, None)

    def _encode(self, data, ends, end_id: int, joined: str | None):
        K = kernels()
        buf = np.frombuffer(data, np.uint8)
        if len(ends) and ends[-1] != len(buf):
            raise ValueError(f"the texts end at byte {ends[-1]}, the data at {len(buf)}")
        self._make_room(len(buf))
        cuts = self._jieba_byte_cuts(buf, ends, joined) if self._jieba else np.zeros(0, np.int64)
        size = len(buf)
        words, chunk_ref, miss_bytes, miss_char_ends, miss_slot = self._work_arrays(size)
        as_bytes = words.view(np.uint8)  # the bytes as aligned words, zeros after
        as_bytes[:size] = buf
        as_bytes[size:size + 24] = 0
        doc_chunk_ends = np.empty(len(ends), np.int64)
        progress = np.zeros(6, np.int64)
        while True:
            growing = len(self._table) < 1 << _MAX_TABLE_BITS
            K.cut_and_look_up(buf, words, ends, cuts, self._joinable, self._sides,
                              self._char_info, self._table, self._kept, self._state,
                              self._hash_mask, len(self._table) // 2,
                              len(self._table) * 3 // 8 if growing else len(self._table),
                              progress, chunk_ref, doc_chunk_ends, miss_bytes, miss_char_ends,
                              miss_slot)
            if progress[0] == len(ends):
                break
            self._grow_table(miss_slot)
        n_chunks, n_misses, n_miss_bytes = (int(x) for x in progress[1:4])
        miss_ids, miss_id_ends = self._encode_misses(
            miss_bytes[:n_miss_bytes].tobytes().decode("utf-8"), miss_char_ends[:n_misses])
        if len(self._ids) < self._state[_IDS] + len(miss_ids):
            self._ids = _grown(self._ids, int(self._state[_IDS]) + len(miss_ids))
        K.keep_ids(miss_slot[:n_misses], miss_id_ends, miss_ids, self._char_info, self._table,
                   self._ids, self._state)
        chunk_ref = chunk_ref[:n_chunks]
        counts = np.empty(len(ends), np.int64)
        out = np.empty(K.count_ids(chunk_ref, doc_chunk_ends, miss_id_ends, end_id, counts),
                       np.int32)
        K.write_ids(chunk_ref, doc_chunk_ends, miss_id_ends, miss_ids, self._ids, end_id, out)
        return out, counts

    def _work_arrays(self, size: int):
        """The per-batch arrays for a batch of `size` bytes: kept from batch to batch, as
        fresh ones would cost page faults every batch."""
        if self._work is None or len(self._work[1]) < size:
            n = max(size, 2 * len(self._work[1]) if self._work else 0)
            self._work = (np.zeros(n // 8 + 4, np.uint64), np.empty(n, np.int64),
                          np.empty(n, np.uint8), np.empty(n, np.int64), np.empty(n, np.int64))
        return self._work

    def _encode_misses(self, text: str, char_ends):
        """(ids of the missed chunks concatenated, the end of each one's ids); `text`: the
        chunks, the i-th ending at character char_ends[i]."""
        ends = char_ends.tolist()
        chunks = [text[a:b] for a, b in zip([0] + ends[:-1], ends)]
        if self._shared is None:
            return self._encode_chunks(chunks)
        known = [self._shared.get(c) for c in chunks]
        todo = [c for c, ids in zip(chunks, known) if ids is None]
        if todo:
            ids, id_ends = self._encode_chunks(todo)
            ids, id_ends = ids.tolist(), id_ends.tolist()
            fresh = iter(zip([0] + id_ends[:-1], id_ends))
            if len(self._shared) > _SHARED_CHUNKS:
                self._shared.clear()
            for i, chunk_ids in enumerate(known):
                if chunk_ids is None:
                    a, b = next(fresh)
                    known[i] = self._shared[chunks[i]] = ids[a:b]
        id_ends = np.cumsum(np.fromiter(map(len, known), np.int64, len(known)))
        total = int(id_ends[-1]) if len(id_ends) else 0
        return np.fromiter(chain.from_iterable(known), np.int32, total), id_ends

    def _encode_chunks(self, chunks: list[str]):
        """(ids of `chunks` concatenated, the end of each one's ids): one sentencepiece call
        on the chunks joined by a character no piece holds (no merge crosses it), else one
        call on the list."""
        if not chunks:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        if self._join_misses:
            joined = _SEPARATOR.join(chunks)
            if joined.count(_SEPARATOR) == len(chunks) - 1 and WS_MARK not in joined:
                ids = np.array(self._sp.encode(joined + _SEPARATOR), np.int32)
                s0, s1, s2 = self._separator_ids
                at = np.flatnonzero((ids[:-2] == s0) & (ids[1:-1] == s1) & (ids[2:] == s2))
                if len(at) == len(chunks):
                    keep = np.ones(len(ids), bool)
                    for k in range(3):
                        keep[at + k] = False
                    return ids[keep], at - 3 * np.arange(len(at))
        encoded = self._sp.encode(chunks, num_threads=1)
        for i, chunk in enumerate(chunks):
            if chunk == WS_MARK:  # sentencepiece decodes it as a space: keep its bytes instead
                encoded[i] = self._literal_mark
        id_ends = np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)))
        return np.fromiter(chain.from_iterable(encoded), np.int32, int(id_ends[-1])), id_ends

    def sibling(self) -> "ChunkCacheEncoder":
        """An encoder for another thread. It shares the pair table, jieba's cuts and the ids
        of every chunk sentencepiece encodes for either from now on (so a chunk new to both
        is encoded once), not the chunk table. Make siblings before the threads start."""
        if self._shared is None:
            self._shared = {}
        twin = copy.copy(self)
        twin._work = None
        twin._clear(_MIN_TABLE_BITS)
        return twin

    def _make_room(self, batch_bytes: int) -> None:
        """Grow the cache as it fills, up to its bounds, then start over. (A full cache is
        never wrong: chunks it has no room for are encoded, not kept.)"""
        n_entries, n_kept = int(self._state[_ENTRIES]), int(self._state[_BYTES])
        if n_entries >= len(self._table) // 4 and len(self._table) < 1 << _MAX_TABLE_BITS:
            self._grow_table(np.zeros(0, np.int64))
        if n_entries >= len(self._table) * 3 // 8 or n_kept >= _KEPT_BYTES * 3 // 4:
            self._clear(_MIN_TABLE_BITS)
        n_kept = int(self._state[_BYTES])
        wanted = min(n_kept + batch_bytes, _KEPT_BYTES)
        if len(self._kept) < wanted:
            self._kept = _grown(self._kept, wanted)

    def _grow_table(self, miss_slot) -> None:
        table = np.zeros((2 * len(self._table), 4), np.uint64)
        kernels().rehash(self._table, table, miss_slot)
        self._table = table

    def _jieba_byte_cuts(self, buf, ends, joined: str | None):
        """Byte offsets where jieba starts a word inside a Chinese run."""
        if joined is None:
            joined = buf.tobytes().decode("utf-8")
        lead = np.flatnonzero((buf & 0xC0) != 0x80)
        char_ends = np.searchsorted(lead, ends)  # a text's end in characters
        out = []
        for start, end in zip([0] + char_ends[:-1].tolist(), char_ends.tolist()):
            for m in HAN_RUN.finditer(joined, start, end):
                run = m.group()
                cuts = self._jieba_cache.get(run)
                if cuts is None:
                    cuts = jieba_boundaries(run)
                    if len(self._jieba_cache) < 1 << 20:
                        self._jieba_cache[run] = cuts
                out += [m.start() + c for c in cuts]
        return lead[np.array(out, np.int64)] if out else np.zeros(0, np.int64)


# -- the compiled passes --------------------------------------------------------------------

_KERNELS = None
KERNEL_MODULE = "llmkit.tokenizers._chunk_kernels"
_SIGNATURES = {  # of the passes compiled ahead of time: the arrays the encoder hands them
    "mark_pairs": "void(u8[::1], i8[::1], i8[::1])",
    "cut_and_look_up": "void(u1[::1], u8[::1], i8[::1], i8[::1], u8[::1], u1[::1], u8[::1], "
                       "u8[:, ::1], u1[::1], i8[::1], u8, i8, i8, i8[::1], i8[::1], i8[::1], "
                       "u1[::1], i8[::1], i8[::1])",
    "keep_ids": "void(i8[::1], i8[::1], i4[::1], u8[::1], u8[:, ::1], i4[::1], i8[::1])",
    "count_ids": "i8(i8[::1], i8[::1], i8[::1], i8, i8[::1])",
    "write_ids": "void(i8[::1], i8[::1], i8[::1], i4[::1], i4[::1], i8, i4[::1])",
    "rehash": "void(u8[:, ::1], u8[:, ::1], i8[::1])",
}


def kernels():
    """The passes of llmkit.tokenizers._chunk_kernels: compiled ahead of time where that can be had,
    else through numba's JIT (see llmkit.core.aot)."""
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = aot.load(KERNEL_MODULE, _SIGNATURES, what="the chunk-cache encoder",
                            warm_up=_first_call)
    return _KERNELS


def _first_call(module) -> None:
    module.mark_pairs(np.zeros(1, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64))


def _grown(array, size: int):
    """`array` copied into a larger one: `size` elements, or double."""
    out = np.zeros(max(size, 2 * len(array)), array.dtype)
    out[:len(array)] = array
    return out
