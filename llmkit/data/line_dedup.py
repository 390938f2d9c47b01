"""Cross-document line deduplication (CCNet's and datatrove's line dedup): a line found in at
least `line_dedup_min_docs` documents of the corpus — a footer, a menu, a licence line the
per-document boilerplate filter does not know — is cut from every document.

It needs the whole corpus before it can change one document, so `llmkit clean` runs it in
two phases (llmkit.data.clean_stage): `line_counts` counts, per input part, in how many
documents each line occurs (`count_line_keys`, one file per part), then the counts are summed
into the set of frequent lines (`frequent_line_keys`, one file in the work area), and the
clean tasks cut those lines (`drop_frequent_lines`). It lives in clean, not in dedup, because
it edits documents rather than removing them, and it must see lines as clean leaves them
(normalised, boilerplate lines already gone): both phases read lines from that same text.

A line is compared by its key: lower-cased, runs of white space made one space, runs of digits
made one 0 (so "© 2023 Example" and "page 7 of 12" are one line with "© 2024 Example" and
"page 10 of 12"), hashed to 64 bits (blake2b). A line
without a letter ("}", "---", "1.") is structure, not boilerplate, and is never cut; nor are
blank lines. Each document counts a line once however often it repeats it inside.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np

_DIGITS = re.compile(r"\d+")
_SPACES = re.compile(r"\s+")

_frequent_cache: dict = {}  # path -> this process's set of frequent keys (read once)


def line_key(line: str) -> int | None:
    """The 64-bit key of a line, or None for a line never cut (no letter)."""
    if not any(c.isalpha() for c in line):
        return None
    norm = _DIGITS.sub("0", _SPACES.sub(" ", line.strip().lower()))
    return int.from_bytes(hashlib.blake2b(norm.encode(), digest_size=8).digest(), "little")


def document_keys(text: str) -> set[int]:
    return {k for k in map(line_key, text.split("\n")) if k is not None}


def count_line_keys(texts) -> tuple[np.ndarray, np.ndarray]:
    """(keys, documents holding each) over `texts`, keys sorted."""
    keys = [k for text in texts for k in document_keys(text)]
    return np.unique(np.array(keys, np.uint64), return_counts=True)


def save_counts(path: Path, keys: np.ndarray, counts: np.ndarray) -> None:
    np.savez(path, keys=keys, counts=counts.astype(np.int64))


def frequent_line_keys(count_files: list[Path], min_docs: int) -> np.ndarray:
    """The keys found in at least `min_docs` documents over all the parts' count files."""
    keys, counts = [], []
    for f in count_files:
        with np.load(f) as z:
            keys.append(z["keys"])
            counts.append(z["counts"])
    if not keys:
        return np.zeros(0, np.uint64)
    unique, where = np.unique(np.concatenate(keys), return_inverse=True)
    totals = np.bincount(where, weights=np.concatenate(counts), minlength=len(unique))
    return unique[totals >= min_docs]


def save_frequent(path: Path, keys: np.ndarray) -> None:
    """Written under a temporary name and renamed, so that a reader never sees half a file
    (two ranks that both write it write the same bytes)."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}.npy")
    np.save(tmp, keys)
    os.replace(tmp, path)


def load_frequent(path: str | Path) -> frozenset:
    """The frequent keys in `path`, read once per process."""
    path = str(path)
    if path not in _frequent_cache:
        _frequent_cache[path] = frozenset(np.load(path).tolist())
    return _frequent_cache[path]


def drop_frequent_lines(text: str, frequent: frozenset) -> tuple[str, int]:
    """(text without its frequent lines, number of lines cut)."""
    if not frequent:
        return text, 0
    lines = text.split("\n")
    kept = [line for line in lines if line_key(line) not in frequent]
    if len(kept) == len(lines):
        return text, 0
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip("\n"), len(lines) - len(kept)
