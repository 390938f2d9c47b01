"""The compiled passes of llmkit.data.document (numba): cut a document into words and measure
them, measure its lines and paragraphs, and Gopher's n-gram repetition statistics over its
words; `measure` does all of it for every document of a batch in one call. And `scan`, for
llmkit.data.normalize: which normalisation steps have work in each text of a batch.

llmkit.data.document loads them compiled ahead of time (no numba import) when it can, else
through numba's JIT with its cache; see llmkit.core.aot.
"""

import numpy as np
from numba import njit

from llmkit.data.document import (BULLET, CJK, COMMON, HAN, LAYOUT_FIELDS, LETTER, SPACE,
                                  TERMINAL, WORD, WORD_FIELDS)
from llmkit.data.normalize import (ALL_STEPS, BLANK_LINES, CONTROL, CONTROL_CHAR, HTML, KEPT,
                                   MARKUP, NFKC, NOT_NFKC_STABLE, PUNCTUATION_RUN, RUN_MARK,
                                   SPACE_RUN, SURROGATE, TAB, TRAILING_SPACE, WHITESPACE)

NEWLINE, DOT, HASH, ELLIPSIS = 10, 46, 35, 0x2026  # "\n", ".", "#", "…"
TAB_CHAR, SPACE_CHAR = 9, 32
FNV_OFFSET, FNV_PRIME = 14695981039346656037, 1099511628211


@njit(cache=True, nogil=True)
def _cut_words(codes, start, end, classes, stop_hashes, stop_seen, hashes, lengths, counts):
    """Cut codes[start:end] into words like `Doc.words`: the hash (FNV-1a over the code
    points) and length of the i-th word go to hashes[i], lengths[i], the counts of WordCounts
    to counts[:WORD_FIELDS]; returns the number of words."""
    stop_seen[:] = False
    counts[:WORD_FIELDS] = 0
    words, i = 0, start
    while i < end:
        kind = classes[codes[i]]
        if kind & SPACE:
            i += 1
            continue
        h, first, has_word, has_letter = np.uint64(FNV_OFFSET), i, False, False
        while True:
            h = (h ^ np.uint64(codes[i])) * np.uint64(FNV_PRIME)
            has_word |= (kind & WORD) != 0
            has_letter |= (kind & LETTER) != 0
            i += 1
            if classes[codes[i - 1]] & CJK or i == end:  # a CJK character is a word alone
                break
            kind = classes[codes[i]]
            if kind & (SPACE | CJK):
                break
        hashes[words], lengths[words] = h, i - first
        words += 1
        for k in range(stop_hashes.shape[0]):
            if h == stop_hashes[k]:
                stop_seen[k] = True
        lead = classes[codes[first]]
        if lead & CJK:
            counts[4] += 1
            counts[7] += (lead & HAN) != 0
            counts[8] += (lead & COMMON) != 0
        if not has_word:
            counts[1] += 1
            counts[2] += i - first
        if not has_letter:
            counts[3] += 1
        counts[5] += i - first
    counts[0] = words
    counts[6] = words - counts[1]
    counts[9] = stop_seen.sum()
    return words


@njit(cache=True, nogil=True)
def word_stats(codes, classes, stop_hashes, hashes, lengths):
    """`_cut_words` over a whole text: the WordCounts as a tuple. The caller owns `hashes`
    and `lengths` (room for one word per code point)."""
    counts = np.zeros(WORD_FIELDS, np.int64)
    _cut_words(codes, 0, codes.shape[0], classes, stop_hashes,
               np.zeros(stop_hashes.shape[0], np.bool_), hashes, lengths, counts)
    return (counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], counts[6],
            counts[7], counts[8], counts[9])


@njit(cache=True, nogil=True)
def _same(codes, a, a_end, b, b_end):
    """codes[a:a_end] == codes[b:b_end]."""
    if a_end - a != b_end - b:
        return False
    for k in range(a_end - a):
        if codes[a + k] != codes[b + k]:
            return False
    return True


@njit(cache=True, nogil=True)
def _repeats(codes, starts, ends, piece_hashes, pieces):
    """(pieces equal to an earlier piece, code points in those), of the pieces
    codes[starts[p]:ends[p]] for p < pieces, whose hashes are piece_hashes[p]. Equal hashes
    are checked code point by code point, so the counts are exact."""
    bits = 1
    while (1 << bits) < 2 * pieces:
        bits += 1
    owner = np.full(1 << bits, -1, np.int64)  # the piece a slot holds
    mask = np.uint64((1 << bits) - 1)
    repeats, chars = 0, 0
    for p in range(pieces):
        h = piece_hashes[p]
        slot = (h * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits)
        while True:
            q = owner[slot]
            if q < 0:
                owner[slot] = p
                break
            if piece_hashes[q] == h and _same(codes, starts[p], ends[p], starts[q], ends[q]):
                repeats += 1
                chars += ends[p] - starts[p]
                break
            slot = (slot + np.uint64(1)) & mask
    return repeats, chars


@njit(cache=True, nogil=True)
def _layout(codes, start, end, classes, starts, ends, piece_hashes, out):
    """Lines, paragraphs and marks of codes[start:end], as in Layout, to out[:LAYOUT_FIELDS].
    `starts`, `ends`, `piece_hashes`: room for the pieces (one more than the text's "\n"s).
    Two passes over the text: lines (and marks), then paragraphs; each hashes its pieces
    (FNV-1a) on the way, for the repeats."""
    # Lines: the non-empty pieces of text.split("\n").
    lines, bullets, ellipsis_lines, terminal = 0, 0, 0, 0
    hash_marks, ellipses, dots = 0, 0, 0  # dots: the run of "." that ends here
    s = start
    while s <= end:
        e, h = s, np.uint64(FNV_OFFSET)
        while e < end:
            c = codes[e]
            if c == NEWLINE:
                break
            h = (h ^ np.uint64(c)) * np.uint64(FNV_PRIME)
            if c == DOT:
                dots += 1
            else:
                if dots:  # as str.count counts "...": a run of 7 dots holds 2
                    ellipses += dots // 3
                    dots = 0
                hash_marks += c == HASH
                ellipses += c == ELLIPSIS
            e += 1
        ellipses += dots // 3
        dots = 0
        if e > s:
            starts[lines], ends[lines], piece_hashes[lines] = s, e, h
            lines += 1
            j = s  # str.lstrip: the first character that is not a space
            while j < e and classes[codes[j]] & SPACE:
                j += 1
            bullets += j < e and (classes[codes[j]] & BULLET) != 0
            last = codes[e - 1]
            ellipsis_lines += last == ELLIPSIS or (e - s >= 3 and last == DOT and
                                                   codes[e - 2] == DOT and codes[e - 3] == DOT)
            terminal += (classes[last] & TERMINAL) != 0
        s = e + 1
    out[0], out[1], out[2], out[3] = lines, bullets, ellipsis_lines, terminal
    out[4], out[5] = _repeats(codes, starts, ends, piece_hashes, lines)
    out[9], out[10] = hash_marks, ellipses
    # Paragraphs: the non-empty pieces of text.split("\n\n"), which cuts at the first "\n\n"
    # from the left, then goes on after it ("a\n\n\nb" is "a" and "\nb").
    paragraphs, s = 0, start
    while True:
        j, h = s, np.uint64(FNV_OFFSET)
        while j + 1 < end and not (codes[j] == NEWLINE and codes[j + 1] == NEWLINE):
            h = (h ^ np.uint64(codes[j])) * np.uint64(FNV_PRIME)
            j += 1
        last_piece = j + 1 >= end
        if last_piece and j < end:  # the text's last character, not followed by "\n"
            h = (h ^ np.uint64(codes[j])) * np.uint64(FNV_PRIME)
        e = end if last_piece else j
        if e > s:
            starts[paragraphs], ends[paragraphs], piece_hashes[paragraphs] = s, e, h
            paragraphs += 1
        if last_piece:
            break
        s = j + 2
    out[6] = paragraphs
    out[7], out[8] = _repeats(codes, starts, ends, piece_hashes, paragraphs)


@njit(cache=True, nogil=True)
def _repetition(hashes, lengths, top_ns, dup_ns, top, dup):
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


@njit(cache=True, nogil=True)
def repetition_stats(hashes, lengths, top_ns, dup_ns, top, dup):
    """`_repetition`, for words the caller cut (jieba's)."""
    _repetition(hashes, lengths, top_ns, dup_ns, top, dup)


@njit(cache=True, nogil=True)
def measure(codes, ends, classes, stop_hashes, params, top_ns, dup_ns, out):
    """Measure every document of a batch: document d is codes[ends[d - 1]:ends[d]], and its
    row out[d] (zeros) gets WordCounts, then Layout, then the n-gram measures: the characters
    in words they are relative to (0 where they were not taken), top[n] for each n of the
    document's row of `top_ns`, dup[n] for each n of its row of `dup_ns`.

    Row 0 of the n sizes is for words cut at spaces, row 1 for CJK documents (whose words
    are characters); params = (cjk_min_fraction, the fewest words for n-grams in row 0's
    documents, in row 1's, the most). Documents with fewer are not measured: the rules take
    a short text's echoes for style (a refrain, a couplet), not spam; documents with more
    get -1 for the characters, and Doc measures them if a rule asks. The scratch arrays are
    made once per batch, for its longest document.
    """
    longest, most_lines, start = 0, 0, 0  # code points, lines of the largest document
    for d in range(ends.shape[0]):
        lines = 1
        for k in range(start, ends[d]):
            lines += codes[k] == NEWLINE
        longest, most_lines, start = max(longest, ends[d] - start), max(most_lines, lines), ends[d]
    hashes, lengths = np.empty(longest, np.uint64), np.empty(longest, np.int64)
    starts, stops = np.empty(most_lines, np.int64), np.empty(most_lines, np.int64)
    piece_hashes = np.empty(most_lines, np.uint64)
    stop_seen = np.zeros(stop_hashes.shape[0], np.bool_)
    size = max(top_ns.max(), dup_ns.max()) + 1
    top, dup = np.zeros(size, np.int64), np.zeros(size, np.int64)
    ngrams = WORD_FIELDS + LAYOUT_FIELDS
    n_top, n_dup = top_ns.shape[1], dup_ns.shape[1]
    start = 0
    for d in range(ends.shape[0]):
        end, row = ends[d], out[d]
        words = _cut_words(codes, start, end, classes, stop_hashes, stop_seen, hashes, lengths,
                           row)
        _layout(codes, start, end, classes, starts, stops, piece_hashes, row[WORD_FIELDS:])
        cjk, content_words_by_char = row[4], row[6]  # as Doc.is_cjk decides
        s = 1 if cjk > 0 and cjk >= params[0] * content_words_by_char else 0
        if words > params[3]:
            row[ngrams] = -1  # left to Doc.ngram_stats: gopher_max_words most likely removes it
        elif words >= params[1 + s]:
            top[:], dup[:] = 0, 0
            _repetition(hashes[:words], lengths[:words], top_ns[s], dup_ns[s], top, dup)
            row[ngrams] = row[5]  # word_chars
            for i in range(n_top):
                row[ngrams + 1 + i] = top[top_ns[s, i]]
            for i in range(n_dup):
                row[ngrams + 1 + n_top + i] = dup[dup_ns[s, i]]
        start = end


@njit(cache=True, nogil=True)
def scan(codes, ends, classes, keep_cjk_punctuation, limit, found):
    """Which normalisation steps of llmkit.data.normalize have work in each text of a batch
    (text d is codes[ends[d - 1]:ends[d]]): found[d] gets the bits HTML, CONTROL, … of those that
    would change it. `classes` holds the scan's class bits of each code point; `limit` is
    max_punctuation_run."""
    start = 0
    for d in range(ends.shape[0]):
        end, bits = ends[d], 0
        newlines = 0  # "\n"s since the last character other than " " and "\t"
        spaces = 0  # length of the run of " " that ends here
        mark, run = -1, 0  # the mark of the run of marks that ends here, its length
        for k in range(start, end):
            c = codes[k]
            kind = classes[c]
            if kind == 0:  # most characters: nothing to note, and every run is broken
                spaces, newlines, mark, run = 0, 0, -1, 0
                continue
            if kind != WHITESPACE:
                if kind & MARKUP:
                    bits |= HTML
                if kind & CONTROL_CHAR:
                    bits |= CONTROL
                if kind & NOT_NFKC_STABLE and not (keep_cjk_punctuation and kind & KEPT):
                    bits |= NFKC
                if kind & SURROGATE:
                    bits |= ALL_STEPS
            if c == SPACE_CHAR:
                spaces += 1
                # a run of spaces is left alone at the start of the text or of a line
                if spaces == 2 and k - 1 > start and codes[k - 2] != NEWLINE:
                    bits |= SPACE_RUN
            else:
                spaces = 0
            if c == TAB_CHAR:
                bits |= TAB
            elif c == NEWLINE:
                if k > start and (codes[k - 1] == SPACE_CHAR or codes[k - 1] == TAB_CHAR):
                    bits |= TRAILING_SPACE
                newlines += 1
                if newlines >= 3:  # also "\n \n\n": it is "\n\n\n" once trailing spaces go
                    bits |= BLANK_LINES
            elif c != SPACE_CHAR:
                newlines = 0
            if kind & RUN_MARK:
                run = run + 1 if c == mark else 1
                mark = c
                if limit > 0 and run > limit:
                    bits |= PUNCTUATION_RUN
            else:
                mark, run = -1, 0
        if end > start and (codes[end - 1] == SPACE_CHAR or codes[end - 1] == TAB_CHAR):
            bits |= TRAILING_SPACE
        found[d] = bits
        start = end
