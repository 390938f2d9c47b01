"""The compiled kernels of llmkit.data.dedup's sketches (numba): shingles, exact hashes, SimHash
fingerprints, MinHash signatures and band keys (union-find over verified bucket pairs: the
`_cluster_kernels` module).

llmkit.data.dedup.compiled loads them compiled ahead of time (no numba import) when it can,
else through numba's JIT with its cache; see llmkit.core.aot. The modules that use them say what
each computes.
"""

import numpy as np
from numba import njit

from llmkit.data.dedup.shingles import CHARS, WORDS

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
_MIX_PRIME = np.uint64(0x9E3779B97F4A7C15)
_MAX = np.uint64(0xFFFFFFFFFFFFFFFF)


# -- shingles (llmkit.data.dedup.shingles) ---------------------------------------------------

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
def shingles(data, offsets, forced, word_n, char_n, strip_punctuation, cjk_ratio, lower_ascii,
             segmented):
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
def document_modes(data, offsets, strip_punctuation, cjk_ratio):
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


# -- exact hashes (llmkit.data.dedup.exact) ------------------------------------------------

@njit(cache=True)
def exact_hashes(data, offsets, lower_ascii, collapse_whitespace, strip_punctuation):
    n = len(offsets) - 1
    out = np.empty((n, 2), np.uint64)
    for d in range(n):
        h1 = _FNV_OFFSET
        h2 = np.uint64(0x243F6A8885A308D3)
        length = np.uint64(0)
        pending_space = False
        i, end = offsets[d], offsets[d + 1]
        while i < end:
            if data[i] < 0x80:
                width, cls = 1, _ASCII_CLASS[data[i]]
            else:
                cp, width = _decode(data, i, end)
                cls = _char_class(cp)
            if strip_punctuation and cls == _PUNCT:
                i += width
                continue
            if collapse_whitespace and cls == _SPACE:
                pending_space = length > 0
                i += width
                continue
            if pending_space:
                h1 = (h1 ^ np.uint64(32)) * _FNV_PRIME
                h2 = (h2 + np.uint64(32)) * _MIX_PRIME
                h2 ^= h2 >> np.uint64(31)
                length += np.uint64(1)
                pending_space = False
            for k in range(i, i + width):
                byte = np.uint64(data[k])
                if lower_ascii and width == 1 and byte >= 0x41 and byte <= 0x5A:
                    byte += np.uint64(0x20)
                h1 = (h1 ^ byte) * _FNV_PRIME
                h2 = (h2 + byte) * _MIX_PRIME
                h2 ^= h2 >> np.uint64(31)
            length += np.uint64(width)
            i += width
        out[d, 0] = fmix64(h1 ^ length)
        out[d, 1] = fmix64(h2 + length * _FNV_PRIME)
    return out


# -- SimHash (llmkit.data.dedup.simhash) ----------------------------------------------------

@njit(cache=True)
def simhash_fingerprints(hashes, offsets):
    n = len(offsets) - 1
    out = np.zeros(n, np.uint64)
    votes = np.empty(64, np.int64)
    for d in range(n):
        votes[:] = 0
        distinct = np.sort(hashes[offsets[d]:offsets[d + 1]])
        for j in range(len(distinct)):
            h = distinct[j]
            if j > 0 and h == distinct[j - 1]:
                continue
            for bit in range(64):
                votes[bit] += np.int64((h >> np.uint64(bit)) & np.uint64(1)) * 2 - 1
        fp = np.uint64(0)
        for bit in range(64):
            if votes[bit] > 0:
                fp |= np.uint64(1) << np.uint64(bit)
        out[d] = fp
    return out


# -- MinHash (llmkit.data.dedup.minhash) ----------------------------------------------------

@njit(cache=True)
def minhash_signatures(hashes, offsets, num_perm, salt):
    n = len(offsets) - 1
    k = np.uint64(num_perm)
    signatures = np.empty((n, num_perm), np.uint64)
    filled = np.empty(num_perm, np.bool_)
    for d in range(n):
        row = signatures[d]
        row[:] = _MAX
        filled[:] = False
        for j in range(offsets[d], offsets[d + 1]):
            x = fmix64(hashes[j] ^ salt)
            slot = ((x >> np.uint64(32)) * k) >> np.uint64(32)
            row[slot] = min(row[slot], x)
            filled[slot] = True
        if offsets[d + 1] == offsets[d]:
            continue
        for i in range(num_perm):
            attempt = np.uint64(0)
            while not filled[i]:
                attempt += np.uint64(1)
                h = fmix64((np.uint64(i) << np.uint64(32)) ^ attempt ^ salt)
                source = ((h >> np.uint64(32)) * k) >> np.uint64(32)
                if filled[source]:
                    row[i] = row[source]
                    break
    return signatures


@njit(cache=True)
def band_keys(signatures, bands, rows):
    n = signatures.shape[0]
    keys = np.empty((bands, n), np.uint64)
    for d in range(n):
        for band in range(bands):
            h = np.uint64(band + 1)
            for k in range(band * rows, (band + 1) * rows):
                h = fmix64(h ^ signatures[d, k])
            keys[band, d] = h
    return keys
