"""New pieces for a byte-level BPE tokenizer (Qwen, Llama 3, SmolLM2, GPT-2): merges trained on a
script's text and appended after the tokenizer's own, so that every text without a character of
that script keeps its ids.

Why appending keeps old encodings: the `tokenizers` BPE applies, at each step, the applicable merge
of lowest rank. The new merges rank after every old one and each joins two tokens into a string of
whole characters of the target script only (never a string the vocabulary already holds). UTF-8 is
self-synchronising, so the bytes of such a string occur in a text only where those characters do: a
new merge never fires on a word without them, and old merges never see a new token. Words with the
script's characters are encoded by the old merges first, then the new ones; training continues BPE
from exactly those encodings (the `tokenizers` trainer cannot start from an existing merge list, and
merges learnt from raw bytes would not fit the splits the old merges leave).

Pre-tokenisation and normalisation are the tokenizer's own (its `pre_tokenizer` and `normalizer`),
so the pieces are trained on the words the tokenizer will see.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

from llmkit.tokenizers.cjk import HAN_RANGES, KANA_RANGES
from llmkit.errors import UserError

# the scripts pieces can be trained for: code point ranges
SCRIPTS = {"han": HAN_RANGES, "kana": KANA_RANGES, "hangul": ((0xAC00, 0xD7A3),)}


@lru_cache(maxsize=1)
def byte_of_char() -> dict[str, int]:
    """The byte each character of a byte-level token stands for (GPT-2's printable byte map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return {c: b for b, c in chars.items()}


def token_bytes(token: str) -> bytes | None:
    """The bytes of a byte-level token; None for a token that is not one (an added special token)."""
    table = byte_of_char()
    try:
        return bytes(table[c] for c in token)
    except KeyError:
        return None


def script_bytes_test(script: str):
    """A function telling whether bytes can only be the UTF-8 of `script`'s characters: whole ones,
    then at most the start of one more whose every completion is one, the first byte starting a
    character (so in valid UTF-8 those bytes occur only where such characters are)."""
    if script not in SCRIPTS:
        raise UserError(f"extend-vocab script must be one of {', '.join(SCRIPTS)}, got {script!r}")
    ranges = SCRIPTS[script]

    def within(lo: int, hi: int) -> bool:
        return any(a <= lo and hi <= b for a, b in ranges)

    def only_script(raw: bytes) -> bool:
        whole, cut = _whole_prefix(raw)
        try:
            text = raw[:cut].decode("utf-8")
        except UnicodeDecodeError:
            return False
        if not all(within(ord(c), ord(c)) for c in text):
            return False
        rest = raw[cut:]
        if not rest:
            return bool(text)
        try:  # the lowest and highest characters that complete `rest`
            missing = whole - len(rest)
            lo, hi = (ord((rest + fill * missing).decode("utf-8")) for fill in (b"\x80", b"\xbf"))
        except UnicodeDecodeError:
            return False
        return within(lo, hi)

    return only_script


def _whole_prefix(raw: bytes) -> tuple[int, int]:
    """(length of the last character that `raw` starts, where that character starts): the bytes
    before the cut are whole characters when `raw` ends inside one."""
    k = 0
    while k < len(raw):
        lead = raw[k]
        size = 1 if lead < 0xC0 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4
        if k + size > len(raw):
            return size, k
        k += size
    return 0, len(raw)


def has_script(text: str, script: str) -> bool:
    ranges = SCRIPTS[script]
    return any(any(lo <= ord(c) <= hi for lo, hi in ranges) for c in text)


def byte_level_problem(data: dict) -> str | None:
    """Why a tokenizer.json is not a byte-level BPE this module can extend, or None."""
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        return f"its model is {model.get('type')!r}, not BPE"
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "its BPE marks word pieces (continuing_subword_prefix / end_of_word_suffix)"
    if not _has_byte_level(data.get("pre_tokenizer")):
        return "it is not byte-level (no ByteLevel pre-tokenizer: a sentencepiece-style BPE with byte fallback)"
    return None


def _has_byte_level(node) -> bool:
    if not isinstance(node, dict):
        return False
    return node.get("type") == "ByteLevel" or any(_has_byte_level(n) for n in node.get("pretokenizers", []))


def script_words(backend, texts: Iterable[str], script: str) -> Counter:
    """The tokenizer's pre-tokens (byte-level strings) that hold a character of `script`, counted."""
    words: Counter = Counter()
    normalizer, pre = backend.normalizer, backend.pre_tokenizer
    for text in texts:
        if not has_script(text, script):
            continue
        if normalizer is not None:
            text = normalizer.normalize_str(text)
        for piece, _ in pre.pre_tokenize_str(text):
            shown = (token_bytes(piece) or b"").decode("utf-8", errors="replace")
            if has_script(shown, script):
                words[piece] += 1
    return words


@dataclass
class Extension:
    merges: list[tuple[str, str]]  # appended after the tokenizer's, in rank order
    tokens: list[str]              # the new vocabulary entries, in id order


def train_extension(backend, words: Counter, script: str, new_tokens: int, min_frequency: int) -> Extension:
    """Continue BPE on `words` (encoded by the tokenizer's own model) with merges whose result is a
    string of whole `script` characters not in the vocabulary, until `new_tokens` entries exist or
    no such pair occurs `min_frequency` times."""
    only_script = script_bytes_test(script)
    vocab = backend.get_vocab(with_added_tokens=True)
    seqs = [[t.value for t in backend.model.tokenize(w)] for w in words]
    freqs = list(words.values())

    @lru_cache(maxsize=None)
    def eligible(a: str, b: str) -> bool:
        raw = token_bytes(a + b)
        return a + b not in vocab and raw is not None and only_script(raw)

    counts: Counter = Counter()
    where: dict = defaultdict(set)

    def add_pairs(k: int, sign: int, changed: set) -> None:
        seq = seqs[k]
        for pair in zip(seq, seq[1:]):
            if eligible(*pair):
                counts[pair] += sign * freqs[k]
                changed.add(pair)
                if sign > 0:
                    where[pair].add(k)

    changed: set = set()
    for k in range(len(seqs)):
        add_pairs(k, 1, changed)
    heap = [(-counts[p], p) for p in changed]
    heapq.heapify(heap)
    merges, tokens, added = [], [], set()
    while len(tokens) < new_tokens and heap:
        negative, pair = heapq.heappop(heap)
        if counts.get(pair, 0) != -negative:
            continue  # stale: a fresher entry holds its count
        if -negative < min_frequency:
            break
        joined = pair[0] + pair[1]
        merges.append(pair)
        if joined not in added:  # two merges may make one string (中+国人, 中国+人)
            added.add(joined)
            tokens.append(joined)
        changed = set()
        for k in list(where.pop(pair, ())):
            add_pairs(k, -1, changed)
            seqs[k] = _merged(seqs[k], *pair)
            add_pairs(k, 1, changed)
        for p in changed:
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
        counts.pop(pair, None)
    return Extension(merges, tokens)


def _merged(seq: list[str], a: str, b: str) -> list[str]:
    out, i = [], 0
    while i < len(seq):
        if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(seq[i])
            i += 1
    return out


def extended_tokenizer_json(data: dict, extension: Extension) -> tuple[dict, list[int]]:
    """A copy of tokenizer.json `data` with the new tokens after every existing id (added special
    tokens included) and the new merges after the old ones; returns it and the new ids."""
    data = json.loads(json.dumps(data))
    model = data["model"]
    vocab = model["vocab"]
    first = 1 + max([*vocab.values(), *(t["id"] for t in data.get("added_tokens", []))])
    ids = list(range(first, first + len(extension.tokens)))
    vocab.update(zip(extension.tokens, ids))
    as_strings = bool(model["merges"]) and isinstance(model["merges"][0], str)
    model["merges"] += [f"{a} {b}" if as_strings else [a, b] for a, b in extension.merges]
    return data, ids
