"""The compiled passes of llmkit.tokenizers.chunk_cache (numba): cut a batch into chunks and look them
up, keep the new chunks' ids, write every document's ids.

llmkit.tokenizers.chunk_cache loads them compiled ahead of time (no numba import) when it can, else
through numba's JIT with its cache; see there.
"""

import numpy as np
from numba import njit

from llmkit.tokenizers.chunk_cache import (_BLOCK, _BYTES, _CACHED_BYTES, _ENTRIES, _HASH, _IDS, _INFO,
                                _INLINE_BITS, _LEN_BITS, _MARK, _PAIR_BITS, _PENDING,
                                _SINGLE, _SIZE_BITS, _SPACE, _W0, _W1)


@njit(cache=True, nogil=True)
def load8(words, k):
    """The 8 bytes of the buffer from byte k on, as one little-endian word (`words`: the
    buffer viewed as aligned words)."""
    q, r = k >> 3, np.uint64(8 * (k & 7))
    if r == 0:
        return words[q]
    return (words[q] >> r) | (words[q + 1] << (np.uint64(64) - r))


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
def cut_and_look_up(data, words, doc_ends, cuts, joinable, sides, char_info, table, kept,
                    state, hash_mask, max_entries, stop_at, progress, chunk_ref, doc_chunk_ends,
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

    `words`: `data` as aligned 8-byte words, zeros past its end. `joinable`: the bitset of
    character pairs inside pieces; `sides[c]`: 1 if c is inside a piece with a character
    after it, 2 if with one before it (most Chinese characters are neither: no bitset
    lookup). Chunks are cut a block at a time, then looked up together: the lookups of a
    block do not wait on each other, so the processor overlaps their trips to memory.
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
                            cut = (sides[left] & 1) == 0 or (sides[right] & 2) == 0
                            if not cut:  # both could be inside a piece: is the pair?
                                at = pair_slot(left, right)
                                cut = ((joinable[at >> 6] >> np.uint64(at & 63))
                                       & np.uint64(1)) == 0
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
                    w0 = load8(words, start)
                    if size < 8:
                        w0 &= (np.uint64(1) << np.uint64(8 * size)) - np.uint64(1)
                    w1 = np.uint64(0)
                    if size > 8:
                        w1 = load8(words, start + 8)
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
def keep_ids(miss_slot, miss_id_ends, miss_ids, char_info, table, ids_store, state):
    """Keep the ids of the batch's new chunks in their slots (one or two inline, more in
    `ids_store`)."""
    size_mask = np.uint64((1 << _SIZE_BITS) - 1)
    len_shift = np.uint64(_SIZE_BITS)
    payload_shift = np.uint64(_SIZE_BITS + _LEN_BITS)
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


@njit(cache=True, nogil=True)
def count_ids(chunk_ref, doc_chunk_ends, miss_id_ends, end_id, counts):
    """Each document's number of ids (with `end_id` unless it is negative) in `counts`;
    returns their sum."""
    len_shift, len_mask = np.uint64(_SIZE_BITS), np.uint64(_PENDING)
    extra = 1 if end_id >= 0 else 0
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
    return total


@njit(cache=True, nogil=True)
def write_ids(chunk_ref, doc_chunk_ends, miss_id_ends, miss_ids, ids_store, end_id, out):
    """Every document's ids, then `end_id` unless it is negative, into `out`."""
    len_shift, len_mask = np.uint64(_SIZE_BITS), np.uint64(_PENDING)
    payload_shift = np.uint64(_SIZE_BITS + _LEN_BITS)
    inline_mask = np.int64((1 << _INLINE_BITS) - 1)
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
        if end_id >= 0:
            out[o] = end_id
            o += 1
        first = doc_chunk_ends[d]


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
