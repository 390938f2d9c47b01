"""The labelled examples `llmkit quality` trains its classifier on.

Two ways to name them: `--good A,B --bad C` (every row of A and B is good, every row of C bad),
or `--labels L` with a `label_column` whose values say which (good/bad, 1/0, true/false; or
numeric grades such as FineWeb-Edu's 0–5, good at `label_threshold` and above). Each is a
workspace dataset or a .jsonl / .jsonl.gz / .json / .parquet file with a `text` field.

A row that cannot be read (undecodable bytes, broken JSON) or has no text to learn from is
skipped and counted by reason; the classifier's manifest lists the counts and the first
skipped row. A label that is none of the accepted values stops the run (exit 2) naming the
file, row and value: it means the column or its convention was misread, and training on the
rows that happen to parse would hide that.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmkit.tokenizers.cjk import language_of
from llmkit.data.io import BadRecord, dataset_files, read_jsonl
from llmkit.errors import UserError
from llmkit.data.input_files import FILE_STAGE, read_rows

GOOD_WORDS = {"good", "1", "true", "yes", "pos", "positive", "__label__good"}
BAD_WORDS = {"bad", "0", "false", "no", "neg", "negative", "__label__bad"}


@dataclass
class Examples:
    """Labelled texts: 1 = good, 0 = bad; `langs` for per-language metrics."""
    texts: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    langs: list[str] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    first_skipped: str | None = None

    def add(self, text, label: int, lang, where: str) -> None:
        if not isinstance(text, str):
            self.skip("missing_text", where)
        elif not text.strip():
            self.skip("empty_text", where)
        else:
            self.texts.append(text)
            self.labels.append(label)
            self.langs.append(lang if isinstance(lang, str) and lang else language_of(text))

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        self.first_skipped = self.first_skipped or f"{where} ({reason})"

    def label_array(self) -> np.ndarray:
        return np.array(self.labels, dtype=np.int8)

    def stats(self) -> dict:
        return {"good": int(sum(self.labels)), "bad": len(self.labels) - int(sum(self.labels)),
                "skipped_by_reason": dict(sorted(self.skipped.items())),
                "first_skipped": self.first_skipped}


def label_of(value, threshold: float | None) -> int | None:
    """1 (good), 0 (bad) or None (not a label)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in GOOD_WORDS or word in BAD_WORDS:
            return int(word in GOOD_WORDS)
        try:
            value = float(word)
        except ValueError:
            return None
    if isinstance(value, (int, float)) and not math.isnan(value):
        if threshold is not None:
            return int(value >= threshold)
        if value in (0, 1):
            return int(value)
    return None


def junk_label(where: str, column: str, value, threshold: float | None) -> UserError:
    grades = ("" if threshold is not None else
              ", or numeric grades with --set label_threshold=N (good at N and above)")
    return UserError(f"{where}: {column!r} is {value!r}, which is not a label; labels are "
                     f"good/bad, 1/0 or true/false{grades}. Fix the row or pick the column "
                     f"with --set label_column=NAME")


def iter_rows(art, columns: list[str]):
    """(where, row dict or None for an unreadable row) of a dataset artifact or file."""
    path = Path(art.path)
    if art.stage != FILE_STAGE or path.suffix == ".parquet":
        yield from _parquet_rows(path, columns)
    elif path.name.endswith((".jsonl", ".jsonl.gz")):

        for n, record in read_jsonl(path, strict=False):
            bad = isinstance(record, BadRecord) or not isinstance(record, dict)
            yield f"{path}:{n}", (None if bad else record), (
                record.reason if isinstance(record, BadRecord) else "not_an_object")
    elif path.suffix == ".json":
        for n, record in enumerate(read_rows(art), 1):
            yield f"{path}: row {n}", record, None
    else:
        raise UserError(f"{path}: labelled examples are a workspace dataset or a .jsonl, "
                        ".jsonl.gz, .json or .parquet file")


def _parquet_rows(path: Path, columns: list[str]):
    import pyarrow.parquet as pq


    files = [path] if path.is_file() else dataset_files(path)
    for f in files:
        pf = pq.ParquetFile(f)
        names = pf.schema_arrow.names
        missing = [c for c in columns[:1] + columns[2:] if c not in names]
        if missing:
            raise UserError(f"{f}: no column {missing[0]!r} (it has {', '.join(names)})")
        wanted = [c for c in columns if c in names]
        row = 0
        for batch in pf.iter_batches(batch_size=4096, columns=wanted, use_threads=False):
            for record in batch.to_pylist():
                row += 1
                yield f"{f}: row {row}", record, None


def read_examples(good: list, bad: list, labelled: list, *, label_column: str,
                  label_threshold: float | None) -> Examples:
    """The examples of artifacts (`eval_input`s): every row of `good` good, of `bad` bad, of
    `labelled` as its `label_column` says."""
    ex = Examples()
    for arts, fixed in ((good, 1), (bad, 0), (labelled, None)):
        for art in arts:
            columns = ["text", "lang"] + ([label_column] if fixed is None else [])
            for where, row, reason in iter_rows(art, columns):
                if row is None:
                    ex.skip(reason, where)
                    continue
                label = fixed
                if fixed is None:
                    if label_column not in row:
                        raise UserError(f"{where}: no field {label_column!r}; name the label "
                                        f"column with --set label_column=NAME")
                    label = label_of(row[label_column], label_threshold)
                    if label is None:
                        raise junk_label(where, label_column, row[label_column], label_threshold)
                ex.add(row.get("text"), label, row.get("lang"), where)
    return ex


def require_both_classes(ex: Examples, sources: str) -> None:
    n_good = sum(ex.labels)
    if n_good < 2 or len(ex.labels) - n_good < 2:
        skipped = f"; skipped: {dict(ex.skipped)}" if ex.skipped else ""
        raise UserError(f"quality: need at least 2 good and 2 bad examples with text, got "
                        f"{n_good} good and {len(ex.labels) - n_good} bad from {sources}"
                        f"{skipped}")
