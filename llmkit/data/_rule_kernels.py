"""The compiled passes of llmkit.data.rules (numba): cut a document into words and measure
them, and Gopher's n-gram repetition statistics over those words.

llmkit.data.rules loads them compiled ahead of time (no numba import) when it can, else
through numba's JIT with its cache; see llmkit.aot.
"""

import numpy as np
from numba import njit

from llmkit.data.rules import CJK, COMMON, HAN, LETTER, SPACE, WORD


@njit(cache=True, nogil=True)
def word_stats(codes, classes, stop_hashes, hashes, lengths):
    """Cut a text (as code points) into words like `Doc.words` and measure them.

    Writes the hash and the length of the i-th word to hashes[i], lengths[i] (room for one
    word per code point) and returns the counts as in WordCounts. `classes[c]` holds the
    SPACE / CJK / WORD (str.isalnum or "_") / LETTER (str.isalpha) / HAN / COMMON (in
    COMMON_HAN) bits of c; `stop_hashes` are the `word_hash`es of the stop words. The caller
    owns the arrays: an array made here would cost more to hand back than the pass itself on
    a short document.
    """
    size = codes.shape[0]
    counts = np.zeros(10, np.int64)
    stop_seen = np.zeros(stop_hashes.shape[0], np.bool_)
    words, i = 0, 0
    while i < size:
        kind = classes[codes[i]]
        if kind & SPACE:
            i += 1
            continue
        h, start, has_word, has_letter = np.uint64(14695981039346656037), i, False, False
        while True:  # FNV-1a over the code points
            h = (h ^ np.uint64(codes[i])) * np.uint64(1099511628211)
            has_word |= (kind & WORD) != 0
            has_letter |= (kind & LETTER) != 0
            i += 1
            if classes[codes[i - 1]] & CJK or i == size:
                break
            kind = classes[codes[i]]
            if kind & (SPACE | CJK):
                break
        hashes[words], lengths[words] = h, i - start
        words += 1
        for k in range(stop_hashes.shape[0]):
            if h == stop_hashes[k]:
                stop_seen[k] = True
        first = classes[codes[start]]
        if first & CJK:
            counts[4] += 1
            counts[7] += (first & HAN) != 0
            counts[8] += (first & COMMON) != 0
        if not has_word:
            counts[1] += 1
            counts[2] += i - start
        if not has_letter:
            counts[3] += 1
        counts[5] += i - start
    counts[0] = words
    counts[6] = words - counts[1]
    counts[9] = stop_seen.sum()
    return (counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], counts[6],
            counts[7], counts[8], counts[9])


@njit(cache=True, nogil=True)
def repetition_stats(hashes, lengths, top_ns, dup_ns, top, dup):
    """Gopher's n-gram repetition measures over a document's words (given as hashes, lengths),
    written to `top` and `dup` (zeros, one more than the largest n long).

    For each n in `top_ns`, top[n]: characters covered by the most frequent n-gram (count ×
    length; 0 when no n-gram repeats). For each n in `dup_ns`, dup[n]: characters of the words
    covered by n-grams that repeat an earlier one (the first occurrence is not counted, so a
    text pasted twice scores one half). Characters are the words' own, spaces excluded.
    """
    size = hashes.shape[0]
    max_n = max(top_ns.max(), dup_ns.max())
    want_top = np.zeros(max_n + 1, np.bool_)
    want_top[top_ns] = True
    want_dup = np.zeros(max_n + 1, np.bool_)
    want_dup[dup_ns] = True
    bits = 1
    while (1 << bits) < 2 * size:
        bits += 1
    # An open-addressing table of n-gram -> count; a slot belongs to the current n when its
    # stamp is n, so the table is never cleared between sizes.
    keys = np.empty(1 << bits, np.uint64)
    counts = np.empty(1 << bits, np.int64)
    stamps = np.zeros(1 << bits, np.int64)
    gram = hashes.copy()  # gram[i] = hash of the n-gram starting at word i
    chars = lengths.copy()
    covered = np.zeros(size + 1, np.int64)  # +1 where a repeat starts, -1 past its end
    for n in range(2, max_n + 1):
        m = size - n + 1
        if m < 2:
            break
        for i in range(m):
            gram[i] = gram[i] * np.uint64(1000003) + hashes[i + n - 1]
            chars[i] += lengths[i + n - 1]
        if not (want_top[n] or want_dup[n]):
            continue
        covered[:] = 0
        best, repeats = 0, 0
        for i in range(m):
            g = gram[i]
            slot = (g * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits)
            while stamps[slot] == n and keys[slot] != g:
                slot = (slot + np.uint64(1)) & np.uint64((1 << bits) - 1)
            if stamps[slot] != n:
                stamps[slot], keys[slot], counts[slot] = n, g, 1
                continue
            counts[slot] += 1
            repeats += 1
            best = max(best, counts[slot] * chars[i])
            covered[i] += 1
            covered[i + n] -= 1
        if repeats == 0:
            break  # no n-gram repeats, so no longer one does: every later count is 0
        top[n] = best
        if want_dup[n]:
            depth, total = 0, 0
            for i in range(size):
                depth += covered[i]
                if depth > 0:
                    total += lengths[i]
            dup[n] = total
