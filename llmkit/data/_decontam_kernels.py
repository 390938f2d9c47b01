"""The compiled kernels of llmkit.data.decontam (numba): folded tokens with their positions,
the n-grams of evaluation items, an open-addressing hash table, and the scan of documents.

llmkit.data.decontam_index loads them ahead of time (llmkit.core.aot). They work on code points
(UTF-32), so a token's position is a Python string index: excision cuts the original text.
Token and n-gram hashes are the dedup shingles' (FNV-1a over the token, an n-gram mixed
token by token with its width, MurmurHash3's finaliser), over folded code points instead of
UTF-8 bytes so that full-width, accented and upper-case forms hash as their plain ones.
"""

import numpy as np
from numba import njit

# classes of folded code points (llmkit.data.decontam_index.fold_tables)
SPACE, PUNCT, UNSEGMENTED, WORD = 0, 1, 2, 3

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_SHINGLE_PRIME = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, inline="always")
def fmix64(h):
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


@njit(cache=True)
def _grow(a, need):
    if need <= len(a):
        return a
    b = np.empty(max(need, 2 * len(a)), a.dtype)
    b[:len(a)] = a
    return b


@njit(cache=True)
def text_tokens(codes, ends, fold_offsets, fold_cps, classes):
    """Tokens of each text codes[ends[i-1]:ends[i]]: runs of word characters and single
    unsegmented-script characters, after folding each code point (`fold_cps[fold_offsets[c]:
    fold_offsets[c + 1]]`; code points past the table are words as they are). Returns (hash,
    start, stop, is_unsegmented) per token and each text's token offsets; start/stop are code
    point indices into the text."""
    table = len(fold_offsets) - 1
    cap = max(16, len(codes) // 3)
    hashes = np.empty(cap, np.uint64)
    starts = np.empty(cap, np.int64)
    stops = np.empty(cap, np.int64)
    cjk = np.empty(cap, np.uint8)
    offsets = np.empty(len(ends) + 1, np.int64)
    offsets[0] = 0
    one = np.empty(1, np.uint32)
    count = 0
    begin = 0
    for t in range(len(ends)):
        in_word = False
        h = _FNV_OFFSET
        for i in range(begin, ends[t]):
            cp = codes[i]
            if cp < table:
                folded = fold_cps[fold_offsets[cp]:fold_offsets[cp + 1]]
            else:
                one[0] = cp
                folded = one
            for f in folded:
                cls = classes[f] if f < table else WORD
                if cls == WORD:
                    if not in_word:
                        h = _FNV_OFFSET
                        in_word = True
                        if count + 2 > len(hashes):
                            hashes, starts = _grow(hashes, count + 2), _grow(starts, count + 2)
                            stops, cjk = _grow(stops, count + 2), _grow(cjk, count + 2)
                        starts[count] = i - begin
                    h = (h ^ np.uint64(f)) * _FNV_PRIME
                    stops[count] = i + 1 - begin
                    continue
                if in_word:
                    hashes[count] = fmix64(h)
                    cjk[count] = 0
                    count += 1
                    in_word = False
                if cls == UNSEGMENTED:
                    if count + 2 > len(hashes):
                        hashes, starts = _grow(hashes, count + 2), _grow(starts, count + 2)
                        stops, cjk = _grow(stops, count + 2), _grow(cjk, count + 2)
                    hashes[count] = fmix64(np.uint64(f) * _FNV_PRIME + np.uint64(0x51ED27))
                    starts[count] = i - begin
                    stops[count] = i + 1 - begin
                    cjk[count] = 1
                    count += 1
        if in_word:
            hashes[count] = fmix64(h)
            cjk[count] = 0
            count += 1
        offsets[t + 1] = count
        begin = ends[t]
    return hashes[:count].copy(), starts[:count].copy(), stops[:count].copy(), \
        cjk[:count].copy(), offsets


@njit(cache=True, inline="always")
def gram_hash(tokens, s, width):
    h = np.uint64(width)
    for t in range(s, s + width):
        h = (h ^ tokens[t]) * _SHINGLE_PRIME
        h ^= h >> np.uint64(29)
    return fmix64(h)


@njit(cache=True)
def segment_grams(hashes, cjk, offsets, word_n, char_n, min_words, min_chars, cjk_ratio,
                  prefix):
    """The n-grams of each segment (an evaluation item's text): all of width `char_n` when at
    least `cjk_ratio` of its tokens are unsegmented characters, else of width `word_n`; a
    shorter segment is one n-gram of all its tokens if it has at least `min_chars` /
    `min_words`, else none. Returns (hash, hash of its first `prefix` tokens, segment, first
    token) per n-gram and each segment's (token count, n-gram width or 0 when too short, full
    width, least tokens: `min_chars` or `min_words`)."""
    n_seg = len(offsets) - 1
    total = 0
    for s in range(n_seg):
        total += max(1, offsets[s + 1] - offsets[s])
    grams = np.empty(total, np.uint64)
    firsts = np.empty(total, np.uint64)
    owner = np.empty(total, np.int64)
    starts = np.empty(total, np.int64)
    info = np.zeros((n_seg, 4), np.int64)
    pos = 0
    for s in range(n_seg):
        a, b = offsets[s], offsets[s + 1]
        count = b - a
        unsegmented = 0
        for t in range(a, b):
            unsegmented += cjk[t]
        chars = count > 0 and unsegmented >= cjk_ratio * count
        n = char_n if chars else word_n
        least = min_chars if chars else min_words
        width = n if count >= n else (count if count >= least else 0)
        info[s, 0] = count
        info[s, 1] = width
        info[s, 2] = n
        info[s, 3] = least
        if width == 0:
            continue
        for start in range(a, b - width + 1):
            grams[pos] = gram_hash(hashes, start, width)
            firsts[pos] = gram_hash(hashes, start, prefix)
            owner[pos] = s
            starts[pos] = start
            pos += 1
    return grams[:pos].copy(), firsts[:pos].copy(), owner[:pos].copy(), starts[:pos].copy(), info


@njit(cache=True)
def build_table(keys, values):
    """An open-addressing table (linear probing, a power-of-two size ≥ 2 × keys) of distinct
    `keys` -> `values`; slot keys of 0 are empty (a key of 0 is stored as 1)."""
    size = 16
    while size < 2 * len(keys):
        size *= 2
    table_keys = np.zeros(size, np.uint64)
    table_values = np.zeros(size, np.int64)
    mask = np.uint64(size - 1)
    for k in range(len(keys)):
        key = keys[k] if keys[k] != 0 else np.uint64(1)
        slot = key & mask
        while table_keys[slot] != 0 and table_keys[slot] != key:
            slot = (slot + np.uint64(1)) & mask
        table_keys[slot] = key
        table_values[slot] = values[k]
    return table_keys, table_values


@njit(cache=True, inline="always")
def _lookup(table_keys, table_values, key):
    key = key if key != 0 else np.uint64(1)
    mask = np.uint64(len(table_keys) - 1)
    slot = key & mask
    while table_keys[slot] != 0:
        if table_keys[slot] == key:
            return table_values[slot]
        slot = (slot + np.uint64(1)) & mask
    return -1


@njit(cache=True)
def find_matches(hashes, starts, stops, offsets, prefix_keys, prefix_values, gram_keys,
                 gram_values, widths, prefix, first_only):
    """Every indexed n-gram in each text's tokens: (text, value, start, stop) per match, start
    and stop in code points. A position is tried against the widths only when its first
    `prefix` tokens begin some indexed n-gram (`prefix_keys`), which is rare in clean text.
    `first_only`: stop at a text's first match."""
    cap = 16
    docs = np.empty(cap, np.int64)
    values = np.empty(cap, np.int64)
    spans = np.empty((cap, 2), np.int64)
    found = 0
    for d in range(len(offsets) - 1):
        a, b = offsets[d], offsets[d + 1]
        done = False
        for s in range(a, b - prefix + 1):
            if _lookup(prefix_keys, prefix_values, gram_hash(hashes, s, prefix)) < 0:
                continue
            for w in widths:
                if s + w > b:
                    break
                v = _lookup(gram_keys, gram_values, gram_hash(hashes, s, w))
                if v < 0:
                    continue
                if found == cap:
                    cap *= 2
                    docs, values = _grow(docs, cap), _grow(values, cap)
                    grown = np.empty((cap, 2), np.int64)
                    grown[:found] = spans[:found]
                    spans = grown
                docs[found] = d
                values[found] = v
                spans[found, 0] = starts[s]
                spans[found, 1] = stops[s + w - 1]
                found += 1
                if first_only:
                    done = True
                    break
            if done:
                break
    return docs[:found].copy(), values[:found].copy(), spans[:found].copy()
