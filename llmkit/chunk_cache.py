"""The chunk-cache batch encoder: sentencepiece's ids, each distinct chunk encoded once.

BPE pieces never span a place where no piece of the vocabulary joins the two characters
(llmkit.tokenizer says why), so text cut at those places encodes chunk by chunk to exactly
sentencepiece's ids. One compiled pass over a batch's UTF-8 bytes finds the cuts, hashes each
chunk and looks it up in a table of the chunks seen before; sentencepiece encodes only the
chunks never seen, in one call; a second compiled pass writes the ids. A hit counts only if
the bytes are the same, so ids never depend on the hash.

The table is built for the memory hierarchy: a slot holds a short chunk's bytes, its hash
and its ids (one or two inline), so most chunks cost one cache line.

This module imports numba (a third of a second): llmkit.tokenizer imports it on first use.
"""

from __future__ import annotations

import copy
import sys
from contextlib import contextmanager
from itertools import chain


import numpy as np
from numba import njit

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


@njit(cache=True, nogil=True)
def pair_slot(left, right):
    """Slot of the pair of code points (left, right) in the pair table."""
    return (((left * 0x9E3779B1) ^ (right * 0x85EBCA77)) & 0xFFFFFFFF) >> (32 - _PAIR_BITS)


@njit(cache=True, nogil=True)
def mark_pairs(joinable, left, right):
    for k in range(len(left)):
        at = pair_slot(left[k], right[k])
        joinable[at >> 6] |= np.uint64(1) << np.uint64(at & 63)


@njit(cache=True, nogil=True)
def slot_shift_of(table):
    """How far a hash shifts right to give a slot of `table` (a power of two long)."""
    bits = 0
    while (1 << bits) < len(table):
        bits += 1
    return np.uint64(64 - bits)


@njit(cache=True, nogil=True)
def cut_and_look_up(data, words, doc_ends, cuts, joinable, char_info, table, kept, state,
                    hash_mask, max_entries, stop_at, progress, chunk_ref, doc_chunk_ends,
                    miss_bytes, miss_char_ends, miss_slot):
    """Cut each document of `data` (UTF-8) into chunks and look every chunk up, from document
    progress[0] on, until the table holds `stop_at` chunks (the counts go on in `progress`).

    A chunk ends before a run of spaces, where no piece joins two neighbours of which one
    is not ASCII, around a literal "▁", at a document's end and at each of `cuts` (sorted
    byte offsets). Writes each chunk's `chunk_ref` (the info word of its slot, or -1 - m
    for the m-th miss of the batch) and the chunk count after each document. Misses are
    listed in order: bytes in `miss_bytes`, character counts so far in `miss_char_ends`,
    the slot that keeps each one (-1: not kept, -2 - c: the one-character chunk c) in
    `miss_slot`. progress[1:5]: chunks, misses, miss bytes and miss characters so far.

    `words[k]`: the 8 bytes of `data` from byte k on (zeros past its end). Chunks are cut
    a block at a time, then looked up together: the lookups of a block do not wait on each
    other, so the processor overlaps their trips to memory.
    """
    prime = np.uint64(0x100000001B3)
    len_shift, len_mask = np.uint64(_SIZE_BITS), np.uint64(_PENDING)
    first_doc, n_cut, next_cut = progress[0], progress[1], progress[5]
    block_chunk = np.empty(_BLOCK, np.int64)  # each chunk of the block: its number,
    block_start = np.empty(_BLOCK, np.int64)  # where it starts,
    block_size = np.empty(_BLOCK, np.int64)   # its bytes,
    block_chars = np.empty(_BLOCK, np.int64)  # its characters,
    block_key = np.empty((_BLOCK, 3), np.uint64)  # its first 16 bytes and its hash (or,
    n_block = 0                                   # for one character, its code point)
    pos = doc_ends[first_doc - 1] if first_doc > 0 else 0
    for d in range(first_doc, len(doc_ends)):
        if state[_ENTRIES] + n_block >= stop_at:
            look_up_block(n_block, block_chunk, block_start, block_size, block_chars,
                          block_key, data, char_info, table, kept, state, max_entries,
                          progress, chunk_ref, miss_bytes, miss_char_ends, miss_slot)
            n_block = 0
            if state[_ENTRIES] >= stop_at:
  # the caller grows the table, then calls again
                break
        end = doc_ends[d]
        start, i = pos, pos
        chars = 0
        prev, prev_space = -1, False
        c, n, space = 0, 0, False
        while True:
            if i == end:
                cut = i > start
            else:
                b = data[i]
                if b < 0x80:
                    c, n = np.int64(b), 1
                elif b < 0xE0:
                    c, n = np.int64(b & 0x1F), 2
                elif b < 0xF0:
                    c, n = np.int64(b & 0x0F), 3
                else:
                    c, n = np.int64(b & 0x07), 4
                n = min(n, end - i)
                for k in range(1, n):
                    c = (c << 6) | (data[i + k] & 0x3F)
                space = c == _SPACE or c == _MARK
                cut = False
                if prev >= 0:
                    if space and not prev_space:
                        cut = True
                    elif c >= 0x80 or prev >= 0x80:
                        if c == _MARK or prev == _MARK:
                            cut = True
                        else:
                            left = _MARK if prev_space else prev
                            right = _MARK if space else c
                            at = pair_slot(left, right)
                            cut = (joinable[at >> 6] >> np.uint64(at & 63)) & np.uint64(1) == 0
                    if len(cuts):
                        while next_cut < len(cuts) and cuts[next_cut] < i:
                            next_cut += 1
                        if next_cut < len(cuts) and cuts[next_cut] == i:
                            cut = True
            if cut:
                size = i - start
                known = False
                if chars == 1:  # a character seen before (most of Chinese): its ids now
                    info = char_info[prev]
                    known = info != 0 and (info >> len_shift) & len_mask != len_mask
                    if known:
                        chunk_ref[n_cut] = np.int64(info)
                if not known:
                    # the first 16 bytes, zeros past the end: two unaligned 8-byte loads
                    w0 = words[start]
                    if size < 8:
                        w0 &= (np.uint64(1) << np.uint64(8 * size)) - np.uint64(1)
                    w1 = np.uint64(0)
                    if size > 8:
                        w1 = words[start + 8]
                        if size < 16:
                            w1 &= (np.uint64(1) << np.uint64(8 * (size - 8))) - np.uint64(1)
                    tail = np.uint64(0)
                    for k in range(start + 16, i):
                        tail = (tail ^ np.uint64(data[k])) * prime
                    block_chunk[n_block] = n_cut
                    block_start[n_block], block_size[n_block] = start, size
                    block_chars[n_block] = chars
                    block_key[n_block, 0], block_key[n_block, 1] = w0, w1
                    if chars == 1:
                        block_key[n_block, 2] = np.uint64(prev)
                    else:
                        h = (w0 * np.uint64(0x9E3779B97F4A7C15)) ^ (
                            w1 * np.uint64(0xC2B2AE3D27D4EB4F)) ^ (tail + np.uint64(size))
                        block_key[n_block, 2] = ((h ^ (h >> np.uint64(29)))
                                                 * np.uint64(0x165667B19E3779F9)) & hash_mask
                    n_block += 1
                    if n_block == _BLOCK:
                        look_up_block(n_block, block_chunk, block_start, block_size,
                                      block_chars, block_key, data, char_info, table, kept,
                                      state, max_entries, progress, chunk_ref, miss_bytes,
                                      miss_char_ends, miss_slot)
                        n_block = 0
                n_cut += 1
                start, chars = i, 0
            if i == end:
                break
            chars += 1
            prev, prev_space = c, space
            i += n
        doc_chunk_ends[d] = n_cut
        pos = end
        first_doc = d + 1
    look_up_block(n_block, block_chunk, block_start, block_size, block_chars, block_key, data,
                  char_info, table, kept, state, max_entries, progress, chunk_ref, miss_bytes,
                  miss_char_ends, miss_slot)
    progress[0], progress[1], progress[5] = first_doc, n_cut, next_cut


@njit(cache=True, nogil=True)
def look_up_block(n_block, block_chunk, block_start, block_size, block_chars, block_key, data,
                  char_info, table, kept, state, max_entries, progress, chunk_ref, miss_bytes,
                  miss_char_ends, miss_slot):
    """Look up the chunks of a block (see cut_and_look_up); a chunk not found is a miss, and
    is kept (pending its ids) while there is room."""
    n_entries, n_kept, n_single = state[_ENTRIES], state[_BYTES], state[_SINGLE]
    n_misses = progress[2]
    n_miss_bytes, n_miss_chars = progress[3], progress[4]
    slot_mask = len(table) - 1
    slot_shift = slot_shift_of(table)
    size_mask = np.uint64((1 << _SIZE_BITS) - 1)
    len_shift, len_mask = np.uint64(_SIZE_BITS), np.uint64(_PENDING)
    payload_shift = np.uint64(_SIZE_BITS + _LEN_BITS)
    for j in range(n_block):
        start, size, chars = block_start[j], block_size[j], block_chars[j]
        w0, w1, h = block_key[j, 0], block_key[j, 1], block_key[j, 2]
        usize = np.uint64(size)
        info = np.uint64(0)
        found = False
        slot = 0
        long_chunk = size > 16
        if chars == 1:  # most of Chinese: a direct table by code point
            info = char_info[np.int64(h)]
            found = info != 0
        elif size <= _CACHED_BYTES:
            slot = np.int64(h >> slot_shift)
            while table[slot, _INFO] != 0:
                info = table[slot, _INFO]
                if (table[slot, _HASH] == h and (info & size_mask) == usize
                        and table[slot, _W0] == w0):
                    if long_chunk:
                        a = np.int64(table[slot, _W1])
                        found = True
                        for k in range(size):
                            if kept[a + k] != data[start + k]:
                                found = False
                                break
                    else:
                        found = table[slot, _W1] == w1
                    if found:
                        break
                slot = (slot + 1) & slot_mask
        if found:
            if (info >> len_shift) & len_mask == len_mask:  # new in this batch
                ref = -1 - np.int64(info >> payload_shift)
            else:
                ref = np.int64(info)
        else:
            pending = usize | (len_mask << len_shift) | (np.uint64(n_misses) << payload_shift)
            if chars == 1:
                char_info[np.int64(h)] = pending
                n_single += 1
                miss_slot[n_misses] = -2 - np.int64(h)
            elif (size <= _CACHED_BYTES and n_entries < max_entries
                    and (not long_chunk or n_kept + size <= len(kept))):
                table[slot, _W0], table[slot, _HASH] = w0, h
                if long_chunk:
                    table[slot, _W1] = np.uint64(n_kept)
                    for k in range(size):
                        kept[n_kept + k] = data[start + k]
                    n_kept += size
                else:
                    table[slot, _W1] = w1
                table[slot, _INFO] = pending
                n_entries += 1
                miss_slot[n_misses] = slot
            else:
                miss_slot[n_misses] = -1
            for k in range(size):
                miss_bytes[n_miss_bytes + k] = data[start + k]
            n_miss_bytes += size
            n_miss_chars += chars
            miss_char_ends[n_misses] = n_miss_chars
            ref = -1 - n_misses
            n_misses += 1
        chunk_ref[block_chunk[j]] = ref
    state[_ENTRIES], state[_BYTES], state[_SINGLE] = n_entries, n_kept, n_single
    progress[2] = n_misses

    progress[3], progress[4] = n_miss_bytes, n_miss_chars


@njit(cache=True, nogil=True)
def write_ids(chunk_ref, doc_chunk_ends, miss_slot, miss_id_ends, miss_ids, char_info, table,
              ids_store, state, end_id):
    """Keep the ids of the new chunks in their slots, then write every document's ids (and
    `end_id` after each one, unless it is negative). Returns (ids, ids per document)."""
    size_mask = np.uint64((1 << _SIZE_BITS) - 1)
    len_shift, len_mask = np.uint64(_SIZE_BITS), np.uint64(_PENDING)
    payload_shift = np.uint64(_SIZE_BITS + _LEN_BITS)
    inline_mask = np.int64((1 << _INLINE_BITS) - 1)
    n_ids = state[_IDS]
    for m in range(len(miss_slot)):
        slot = miss_slot[m]
        if slot == -1:
            continue
        a = miss_id_ends[m - 1] if m > 0 else 0
        count = miss_id_ends[m] - a
        if count == 1:
            payload = np.int64(miss_ids[a])
        elif count == 2:
            payload = np.int64(miss_ids[a]) | (np.int64(miss_ids[a + 1]) << _INLINE_BITS)
        else:
            payload = n_ids
            for k in range(count):
                ids_store[n_ids + k] = miss_ids[a + k]
            n_ids += count
        info = np.uint64(count) << len_shift | np.uint64(payload) << payload_shift
        if slot >= 0:
            table[slot, _INFO] = (table[slot, _INFO] & size_mask) | info
        else:
            char_info[-2 - slot] = info | np.uint64(1)  # (any size: never 0)
    state[_IDS] = n_ids
    extra = 1 if end_id >= 0 else 0
    counts = np.empty(len(doc_chunk_ends), np.int64)
    first, total = 0, 0
    for d in range(len(doc_chunk_ends)):
        n = extra
        for k in range(first, doc_chunk_ends[d]):
            ref = chunk_ref[k]
            if ref >= 0:
                n += np.int64((np.uint64(ref) >> len_shift) & len_mask)
            else:
                m = -1 - ref
                n += miss_id_ends[m] - (miss_id_ends[m - 1] if m > 0 else 0)
        counts[d] = n
        total += n
        first = doc_chunk_ends[d]
    out = np.empty(total, np.int32)
    first, o = 0, 0
    for d in range(len(doc_chunk_ends)):
        for k in range(first, doc_chunk_ends[d]):
            ref = chunk_ref[k]
            if ref >= 0:
                count = np.int64((np.uint64(ref) >> len_shift) & len_mask)
                payload = np.int64(np.uint64(ref) >> payload_shift)
                if count == 1:
                    out[o] = payload
                elif count == 2:
                    out[o] = payload & inline_mask
                    out[o + 1] = payload >> _INLINE_BITS
                else:
                    for j in range(count):
                        out[o + j] = ids_store[payload + j]
            else:
                m = -1 - ref
                a = miss_id_ends[m - 1] if m > 0 else 0
                count = miss_id_ends[m] - a
                for j in range(count):
                    out[o + j] = miss_ids[a + j]
            o += count
        if extra:
            out[o] = end_id
            o += 1
        first = doc_chunk_ends[d]
    return out, counts


@njit(cache=True, nogil=True)
def rehash(old, table, miss_slot):
    """Put the used slots of `old` into the (empty) `table`, by their hashes; chunks new in
    this batch move in `miss_slot` too."""
    slot_mask = len(table) - 1
    slot_shift = slot_shift_of(table)
    len_shift, len_mask = np.uint64(_SIZE_BITS), np.uint64(_PENDING)
    payload_shift = np.uint64(_SIZE_BITS + _LEN_BITS)
    for s in range(len(old)):
        info = old[s, _INFO]
        if info != 0:
            slot = np.int64(old[s, _HASH] >> slot_shift)
            while table[slot, _INFO] != 0:
                slot = (slot + 1) & slot_mask
            table[slot] = old[s]
            if (info >> len_shift) & len_mask == len_mask:
                miss_slot[np.int64(info >> payload_shift)] = slot


class ChunkCacheEncoder:
    """Encodes batches of texts to the ids sentencepiece gives, each distinct chunk only once.

    `jieba` also cuts Chinese runs at jieba's word boundaries (the hybrid tokenizer). Not
    safe to share between threads: give each thread its own (they may share `sp`).
    `hash_mask` is for tests: 0 makes every chunk's hash collide.
    """

    def __init__(self, sp, *, jieba: bool = False, hash_mask: int = (1 << 64) - 1):
        if sp.get_piece_size() > 1 << _INLINE_BITS:
            raise ValueError(f"the chunk cache holds ids below {1 << _INLINE_BITS}")
        self._sp = sp
        self._jieba = jieba
        self._jieba_cache: dict[str, list[int]] = {}
        self._joinable = self._pair_table()
        self._literal_mark = [sp.piece_to_id(f"<0x{b:02X}>") for b in WS_MARK.encode("utf-8")]
        self._separator_ids = [sp.piece_to_id(f"<0x{b:02X}>")
                               for b in _SEPARATOR.encode("utf-8")]
        # the separator must come out as its bytes (no piece holds it) for the joined call
        self._join_misses = sp.encode(_SEPARATOR + "a" + _SEPARATOR) == (
            self._separator_ids + sp.encode("a") + self._separator_ids)
        self._hash_mask = np.uint64(hash_mask)
        self._shared: dict[str, list[int]] | None = None  # chunk -> ids, with siblings
        self._clear(_MIN_TABLE_BITS)

    def _clear(self, table_bits: int) -> None:
        self._table = np.zeros((1 << table_bits, 4), np.uint64)
        self._kept = np.zeros(1 << 16, np.uint8)   # long chunks' bytes, concatenated
        self._ids = np.zeros(1 << 16, np.int32)    # ids of chunks of three or more
        self._char_info = np.zeros(0x110000, np.uint64)  # one-character chunks' info
        self._state = np.zeros(4, np.int64)

    def _pair_table(self):
        """Hashed set of character pairs that occur inside some piece (collisions only cut
        less)."""
        sp = self._sp
        pieces = [p for p in sp.id_to_piece(list(range(sp.get_piece_size()))) if len(p) > 1]
        left = np.array(list(map(ord, chain.from_iterable(p[:-1] for p in pieces))), np.int64)
        right = np.array(list(map(ord, chain.from_iterable(p[1:] for p in pieces))), np.int64)
        table = np.zeros(1 << (_PAIR_BITS - 6), np.uint64)  # a bitset: it stays in cache
        with _numba_without_scipy():  # the first compiled call of the process
            mark_pairs(table, left, right)
        return table

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
        buf = np.frombuffer(data, np.uint8)
        if len(ends) and ends[-1] != len(buf):
            raise ValueError(f"the texts end at byte {ends[-1]}, the data at {len(buf)}")
        self._make_room(len(buf))
        cuts = self._jieba_byte_cuts(buf, ends, joined) if self._jieba else np.zeros(0, np.int64)
        size = len(buf)
        padded = np.zeros(size + 16, np.uint8)
        padded[:size] = buf
        words = np.ndarray((size + 9,), np.uint64, buffer=padded, strides=(1,))
        chunk_ref = np.empty(size, np.int64)

        doc_chunk_ends = np.empty(len(ends), np.int64)
        miss_bytes = np.empty(size, np.uint8)
        miss_char_ends = np.empty(size, np.int64)
        miss_slot = np.empty(size, np.int64)
        progress = np.zeros(6, np.int64)
        while True:
            growing = len(self._table) < 1 << _MAX_TABLE_BITS
            cut_and_look_up(buf, words, ends, cuts, self._joinable, self._char_info, self._table,
                            self._kept, self._state, self._hash_mask, len(self._table) // 2,
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
        return write_ids(chunk_ref[:n_chunks], doc_chunk_ends, miss_slot[:n_misses],
                         miss_id_ends, miss_ids, self._char_info, self._table, self._ids,
                         self._state, end_id)

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
        rehash(self._table, table, miss_slot)
        self._table = table

    def _jieba_byte_cuts(self
, buf, ends, joined: str | None):
        """Byte offsets where jieba starts a word inside a Chinese run."""
        from llmkit.tokenizer import HAN_RUN, jieba_boundaries

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


@contextmanager
def _numba_without_scipy():
    """numba's first compiled call in a process imports scipy.linalg (a quarter to half a
    second) only to learn whether np.dot-like functions may call BLAS; without it they use
    a plain loop. These passes call no BLAS: hide scipy.linalg during that call."""
    if "scipy.linalg" in sys.modules:
        yield
        return
    sys.modules["scipy.linalg"] = None  # makes `import scipy.linalg` raise ImportError
    try:
        yield
    finally:
        if sys.modules.get("scipy.linalg", 0) is None:
            del sys.modules["scipy.linalg"]


def _grown(array, size: int):
    """`array` copied into a larger one: `size` elements, or double."""
    out = np.zeros(max(size, 2 * len(array)), array.dtype)
    out[:len(array)] = array
    return out
