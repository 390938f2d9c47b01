"""`llmkit decontaminate`: take evaluation items out of training data.

A benchmark score means little when the model read the benchmark's items in training, and web
text, forums and SFT sets copy benchmarks. So every document is searched for the n-grams of
the evaluation files (`--against`, read as `llmkit eval` reads them; see
llmkit.data.decontam_index for the folding and the n-grams: 13 words, or 13 characters of
Chinese, after NFKC-like folding, case, punctuation and whitespace). A document that contains
one is:
- `mode: remove` (default): removed, with `reason` `contaminated` and `contaminated_by`
  `file:row` (the row of its first match, numbered from 1 as `llmkit eval` numbers them);
- `mode: excise` (NeMo Curator's task decontamination): the matched passages are cut out with
  `excise_chars` characters each side; the pieces left are kept, joined by a blank line, when
  they number at most `max_splits` + 1 and each has `min_piece_chars` (shorter ones are
  dropped). A document with nothing left, or cut into too many pieces, is removed
  (`contaminated_too_many_splits`, `contaminated_nothing_left`); kept rows get a
  `contaminated_by` column (null where nothing was cut).

One task per input part (llmkit.data.pipeline.map_stage, through llmkit.data.driver):
resumable, any --workers / --rank / executor gives the same artifact. The manifest's
`against` stats say per evaluation file what was indexed (items, n-grams, rows skipped and
why), its content hash (what `llmkit eval` checks a model's lineage against) and the rows
it removed or cut.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from llmkit.data.decontam_index import index_for
from llmkit.data.driver import DataConfig, run_data_stage
from llmkit.data.io import dataset_files, open_parquet
from llmkit.data.pipeline import map_stage
from llmkit.errors import ConfigError, UserError
from llmkit.data.input_files import eval_input

CONTAMINATED = "contaminated"


@dataclass
class DecontamConfig(DataConfig):
    against: list[str] = field(default_factory=list)  # evaluation files or datasets (--against)
    mode: Literal["remove", "excise"] = "remove"  # drop a matching document, or cut the match out
    ngram_words: int = 13       # n-gram length in words (GPT-3, NeMo Curator, datatrove use 13)
    ngram_chars: int = 13       # … in characters, for text mostly in Han / kana / Thai script
    min_words: int = 8          # a shorter item is one n-gram of all its words, if it has this many
    min_chars: int = 8          # … characters, for unsegmented scripts; shorter items are skipped
    cjk_ratio: float = 0.5      # an item is read by characters when this share of its tokens are
    max_items_per_ngram: int = 20  # an n-gram shared by more items is the benchmark's template
    max_item_chars: int = 1_000_000  # rows of an evaluation file longer than this are skipped
    excise_chars: int = 200     # excise: characters cut on each side of a match (NeMo: 200)
    max_splits: int = 10        # excise: a document cut into more pieces is removed (NeMo: 10)
    min_piece_chars: int = 200  # excise: a piece left shorter than this is dropped (NeMo: 200)
    text_column: str = "text"   # the column searched
    batch_rows: int = 2048      # documents per batch

    def __post_init__(self):
        for name in ("ngram_words", "ngram_chars", "min_words", "min_chars",
                     "max_items_per_ngram", "max_item_chars", "max_splits", "batch_rows"):
            if getattr(self, name) < 1:
                raise ConfigError(f"decontaminate.{name} must be ≥ 1, got {getattr(self, name)}")
        for short, long in (("min_words", "ngram_words"), ("min_chars", "ngram_chars")):
            if getattr(self, short) > getattr(self, long):
                raise ConfigError(f"decontaminate.{short} must not exceed {long}")
        if self.excise_chars < 0 or self.min_piece_chars < 0:
            raise ConfigError("decontaminate.excise_chars and min_piece_chars must be ≥ 0")
        if not 0.0 <= self.cjk_ratio <= 1.0:
            raise ConfigError(f"decontaminate.cjk_ratio must be in [0, 1], got {self.cjk_ratio}")


# -- a batch ------------------------------------------------------------------------------------

def decontaminate_batch(batch, config: DecontamConfig):
    """(kept table, removed table with `reason` and `contaminated_by`) of one batch."""
    import pyarrow as pa

    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    if config.text_column not in table.column_names:
        raise UserError(f"decontaminate: no column {config.text_column!r} in the input (it has "
                        f"{', '.join(table.column_names)}); set text_column")
    if "contaminated_by" in table.column_names:  # decontaminated before: labelled anew
        table = table.drop_columns(["contaminated_by"])
    texts = [t or "" for t in table.column(config.text_column).to_pylist()]
    index = index_for(config)
    docs, items, spans = index.find(texts, first_only=config.mode == "remove")
    if config.mode == "remove":
        by = {int(d): index.label(int(i)) for d, i in zip(docs, items)}
        return split_rows(table, [CONTAMINATED if d in by else None for d in range(len(texts))],
                          [by.get(d) for d in range(len(texts))])
    return excise_rows(table, texts, docs, items, spans, index, config)


def excise_rows(table, texts, docs, items, spans, index, config: DecontamConfig):
    """Excise mode: matched passages cut out of their documents (see the module's doc)."""
    import pyarrow as pa

    reasons: list = [None] * len(texts)
    by: list = [None] * len(texts)
    new_texts = list(texts)
    bounds = np.searchsorted(docs, np.arange(len(texts) + 1))
    for d in np.unique(docs).tolist():
        rows = slice(bounds[d], bounds[d + 1])
        first = int(np.argmin(spans[rows, 0]))
        by[d] = index.label(int(items[rows][first]))
        pieces = excised_pieces(texts[d], spans[rows], config)
        if pieces is None:
            reasons[d] = "contaminated_too_many_splits"
        elif not pieces:
            reasons[d] = "contaminated_nothing_left"
        else:
            new_texts[d] = "\n\n".join(pieces)
    column = table.schema.get_field_index(config.text_column)
    table = table.set_column(column, table.schema.field(column),
                             pa.array(new_texts, table.schema.field(column).type))
    return split_rows(table, reasons, by, keep_column=True)


def excised_pieces(text: str, spans: np.ndarray, config: DecontamConfig) -> list[str] | None:
    """The pieces of `text` left once every span, widened by `excise_chars` each side, is cut
    out, stripped and without those shorter than `min_piece_chars`; None when the cuts
    would leave more than `max_splits` + 1 pieces."""
    cuts = []
    for start, stop in sorted(spans.tolist()):
        start, stop = max(0, start - config.excise_chars), min(len(text), stop + config.excise_chars)
        if cuts and start <= cuts[-1][1]:
            cuts[-1][1] = max(cuts[-1][1], stop)
        else:
            cuts.append([start, stop])
    edges = [0, *(e for cut in cuts for e in cut), len(text)]
    pieces = [text[a:b].strip() for a, b in zip(edges[::2], edges[1::2])]
    if sum(1 for p in pieces if p) > config.max_splits + 1:
        return None
    return [p for p in pieces if len(p) >= max(1, config.min_piece_chars)]


def split_rows(table, reasons: list, by: list, keep_column: bool = False):
    """(kept rows, removed rows with `reason` and `contaminated_by`); `keep_column`: kept rows
    carry `contaminated_by` too."""
    import pyarrow as pa

    removed = np.array([r is not None for r in reasons], bool)
    labelled = table.append_column("contaminated_by", pa.array(by, pa.string()))
    kept = (labelled if keep_column else table).filter(pa.array(~removed))
    gone = labelled.filter(pa.array(removed))
    gone = gone.append_column("reason", pa.array([r for r in reasons if r is not None],
                                                 pa.string()))
    return kept, gone


# -- the stage ----------------------------------------------------------------------------------

def against_inputs(ws, cfg: DecontamConfig, against: str | None) -> tuple[DecontamConfig, list]:
    """(config naming each evaluation input by absolute path, their artifacts for the
    fingerprint): --against FILE[,FILE…] replaces the config's list."""
    specs = [s.strip() for s in against.split(",") if s.strip()] if against else cfg.against
    if not specs:
        raise UserError("decontaminate needs evaluation files: --against FILE[,FILE…] (jsonl, "
                        "json or parquet, as `llmkit eval` reads them), or datasets by name")
    arts = [eval_input(ws, s) for s in specs]
    paths = [str(Path(a.path).resolve()) for a in arts]
    return dataclasses.replace(cfg, against=paths), arts


def run_decontaminate(ctx, cfg: DecontamConfig, against: str | None = None):
    """Remove (or excise) the documents of --in (default `filtered`) that contain evaluation
    items, into `decontaminated` (or --out)."""
    cfg, arts = against_inputs(ctx.workspace, cfg, against)
    index = index_for(cfg)  # built here first: a bad evaluation file fails before any task
    return run_data_stage(ctx, map_stage(
        "decontaminate", cfg, ctx.input("filtered"), out="decontaminated",
        process_batch=decontaminate_batch, batch_rows=cfg.batch_rows, inputs=arts,
        stats=lambda out: against_stats(index, out)))


def against_stats(index, out_dir: Path) -> dict:
    """The manifest's `against`: per evaluation file what was indexed and what it removed or
    cut, and `template_ngrams` dropped."""
    removed = _labels(Path(out_dir) / "removed")
    excised = _labels(Path(out_dir))
    files = {}
    for label, s in index.files.items():
        files[label] = {"path": s.path, **s.identity, "rows": s.rows,
                        "items_indexed": s.items_indexed, "ngrams": s.ngrams,
                        "skipped": dict(sorted(s.skipped.items())),
                        "rows_removed": removed[label], "rows_excised": excised[label]}
    return {"against": files, "template_ngrams": index.template_ngrams}


def _labels(folder: Path) -> Counter:
    """Rows per evaluation file named in the `contaminated_by` column of a dataset folder."""
    counts: Counter = Counter()
    for part in dataset_files(folder) if folder.is_dir() else []:
        pf = open_parquet(part)
        if "contaminated_by" not in pf.schema_arrow.names:
            continue
        for value in pf.read(columns=["contaminated_by"]).column(0).to_pylist():
            if value is not None:
                counts[value.rsplit(":", 1)[0]] += 1
    return counts
