"""`llmkit quality`: a document-quality classifier trained offline, then a filter by its score.

1. train, when labelled examples are named (`--good A,B --bad C`, or `--labels L` and its
   `label_column`; llmkit.data.quality_labels): the classifier artifact `--model` (default
   `quality_model`), fastText or a head on an LM's hidden states (llmkit.data.quality_classifier).
   `holdout` of each class is kept out of training and the classifier's AUC on it, overall and
   per language, goes in its manifest. Its fingerprint covers the examples and the training
   keys only: a new `keep_top` re-filters without retraining. Without examples, `--model` names
   a classifier trained before.
2. score, a task per input part (llmkit.data.score_filter, which ppl-filter shares; each
   batch's scores kept as it is done, so a killed run resumes): each row's `quality`, P(good) from its first `max_chars` characters.
3. filter, a task per input part (`SplitTasks`): a row is removed when its quality is below
   `min_quality` (reason `quality_below_threshold`), or, without a threshold, when it is not
   among the best `keep_top` share of its `group_by` group (`quality_below_top_share`): exactly
   round(keep_top × n) of a group's n scored rows stay, ties broken by input order. A row
   without text has no quality (NaN) and goes (`quality_no_text`). Removed rows keep `quality`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np

from llmkit.data.driver import Assembled, DataConfig, DataStage, run_data_stage
from llmkit.data.io import dataset_files
from llmkit.data.quality_classifier import (INFO, TEXT_FORMAT, FastTextConfig, HiddenConfig,
                                            fit_classifier, load_classifier)
from llmkit.data.score_filter import ScoreFilter, scored_median_mean
from llmkit.errors import ConfigError, UserError
from llmkit.data.input_files import eval_input, resolve_checkpoint
from llmkit.core.progress import print_summary

REASONS = (None, "quality_below_threshold", "quality_below_top_share", "quality_no_text")
TRAINING_KEYS = ("backend", "max_chars", "label_column", "label_threshold", "holdout", "seed")


@dataclass
class QualityConfig(DataConfig):
    backend: Literal["fasttext", "hidden"] = "fasttext"  # classifier to train; hidden needs --encoder
    min_quality: float | None = None  # keep rows with quality ≥ this; null = the top keep_top share
    keep_top: float = 0.6           # share of each group kept, best first (without min_quality)
    group_by: str | None = None     # keep_top per value of this column (source, lang); null = all rows
    max_chars: int = 4000           # the classifier reads each document's first this many characters
    label_column: str = "label"     # --labels: the column saying good or bad
    label_threshold: float | None = None  # --labels with numeric grades (FineWeb-Edu's 0-5): good at ≥ this
    holdout: float = 0.1            # share of each class kept out of training to measure AUC (0: none)
    seed: int = 0                   # training order, holdout draw and fastText's seed
    encoder_step: str | None = None  # backend hidden: step folder of --encoder (null: its latest)
    fasttext: FastTextConfig = field(default_factory=FastTextConfig)  # backend fasttext's training
    hidden: HiddenConfig = field(default_factory=HiddenConfig)  # backend hidden's encoder and head
    batch_rows: int = 1024          # documents scored per step

    def __post_init__(self):
        if self.min_quality is not None and not 0 <= self.min_quality <= 1:
            raise ConfigError(f"min_quality must be in [0, 1] (a probability), got {self.min_quality}")
        if not 0 < self.keep_top <= 1:
            raise ConfigError(f"keep_top must be in (0, 1], got {self.keep_top}")
        if not 0 <= self.holdout < 1:
            raise ConfigError(f"holdout must be in [0, 1), got {self.holdout}")
        if self.max_chars < 1 or self.batch_rows < 1:
            raise ConfigError("max_chars and batch_rows must be ≥ 1")


def classifier_settings(cfg: QualityConfig, encoder_step: str | None) -> dict:
    """What the classifier artifact is built from besides its inputs: its fingerprint."""
    settings = {k: getattr(cfg, k) for k in TRAINING_KEYS}
    if cfg.backend == "fasttext":
        settings["fasttext"] = dataclasses.asdict(cfg.fasttext)
    else:
        settings["hidden"] = dataclasses.asdict(cfg.hidden)
        settings["encoder_step"] = encoder_step
    return {**settings, "text_format": TEXT_FORMAT}


# -- step 1: the classifier ---------------------------------------------------------------------

def train_classifier(ctx, cfg: QualityConfig, name: str, *, good: list[str], bad: list[str],
                     labels: list[str], encoder: str | None):
    """The classifier artifact `name`, trained on the named examples (or up to date)."""
    if bool(good) != bool(bad):
        raise UserError("--good and --bad go together (or use --labels FILE with a label column)")
    ws = ctx.workspace
    examples = {kind: [eval_input(ws, spec) for spec in specs]
                for kind, specs in (("good", good), ("bad", bad), ("labels", labels))}
    inputs = [a for arts in examples.values() for a in arts]
    enc_art = step = None
    if cfg.backend == "hidden":
        if not encoder:
            raise UserError("backend=hidden pools an LM's hidden states: name it with --encoder RUN")
        enc_art, step = resolve_checkpoint(ws, encoder, cfg.encoder_step)
        inputs.append(enc_art)
    elif encoder:
        raise UserError("--encoder is for --set backend=hidden; fastText needs none")
    b = ws.builder(name, stage="quality", kind="classifier", config=classifier_settings(cfg, step),
                   inputs=inputs, force=ctx.force)
    if not b.up_to_date:
        with b:
            info = fit_classifier(examples, cfg, b.dir, b.work_dir, encoder=(enc_art, step))
            b.stats.update(info["stats"])
        print_classifier_summary(name, b.stats, time.time() - b.started)
    return ws.artifact(name)


def print_classifier_summary(name: str, stats: dict, seconds: float) -> None:
    rows = [("good examples", stats["good"]), ("bad examples", stats["bad"])]
    rows += [(f"  skipped: {r}", n) for r, n in stats["skipped_by_reason"].items()]
    held = stats.get("holdout") or {}
    if held.get("auc") is not None:
        rows.append(("held-out AUC", round(held["auc"], 4)))
        rows += [(f"  {lang}", round(v, 4)) for lang, v in held["auc_by_lang"].items()
                 if v is not None]
    rows.append(("seconds", round(seconds, 2)))
    print_summary(f"{name} trained", rows)


def existing_classifier(ws, name: str):
    art = ws.artifact(name)
    if not (Path(art.path) / INFO).is_file():
        raise UserError(f"--model {name}: {art.path} is not a quality classifier; train one with "
                        f"`llmkit quality --good GOOD --bad BAD --model {name} --train-only`")
    return art


# -- step 2: scores ---------------------------------------------------------------------------

@dataclass(frozen=True)
class QualityScoring:
    """The `score_filter.Scoring` of quality: the classifier's P(good) of each text."""
    classifier: Path

    def key(self) -> str:
        return str(self.classifier)

    def open(self):
        return load_classifier(self.classifier)

    def score(self, texts: list, scorer) -> np.ndarray:
        """P(good) of each text; NaN for a missing or blank one, which has nothing to judge."""
        quality = np.full(len(texts), np.nan)
        has_text = [i for i, t in enumerate(texts) if isinstance(t, str) and t.strip()]
        if has_text:
            quality[has_text] = scorer().score([texts[i] for i in has_text])
        return quality


# -- step 3: the decision ----------------------------------------------------------------------

def removal_codes(quality: np.ndarray, codes: np.ndarray, cfg: QualityConfig) -> np.ndarray:
    """Each row's index into REASONS (0: kept)."""
    scored = ~np.isnan(quality)
    if cfg.min_quality is not None:
        kept = scored & (np.nan_to_num(quality, nan=-1.0) >= cfg.min_quality)
        return np.where(kept, 0, np.where(scored, 1, 3)).astype(np.int8)
    kept = top_share(quality, codes, cfg.keep_top)
    return np.where(kept, 0, np.where(scored, 2, 3)).astype(np.int8)


def top_share(quality: np.ndarray, codes: np.ndarray, share: float) -> np.ndarray:
    """True for the round(share × n) best scored rows of each group of n (ties: earlier row)."""
    keep = np.zeros(len(quality), dtype=bool)
    rows = np.flatnonzero(~np.isnan(quality))
    if not len(rows):
        return keep
    order = rows[np.lexsort((rows, -quality[rows], codes[rows]))]
    group = codes[order]
    rank = np.arange(len(order)) - np.searchsorted(group, group, side="left")
    size = np.bincount(group)[group]
    keep[order[rank < np.floor(share * size + 0.5)]] = True
    return keep


# -- the stage -------------------------------------------------------------------------------

def run_quality(ctx, cfg: QualityConfig, *, good=(), bad=(), labels=(), model: str | None = None,
                encoder: str | None = None, train_only: bool = False):
    """Train the classifier when examples are named, then score and filter --in (default
    dedup) -> `quality` (a task per input part for each pass)."""
    classifier = classifier_for(ctx, cfg, model or "quality_model", good=list(good), bad=list(bad),
                                labels=list(labels), encoder=encoder, train_only=train_only)
    if train_only:
        return classifier
    src = ctx.input("dedup")
    stage = ScoreFilter("quality", "quality", REASONS, QualityScoring(Path(classifier.path)),
                        partial(removal_codes, cfg=cfg), cfg.group_by, cfg.batch_rows)
    design = kept_by_design(cfg)
    return run_data_stage(ctx, DataStage(
        "quality", cfg, [src, classifier], "quality", stage.phases(dataset_files(src.path)),
        assemble, source=str(src.path), notes=[("policy", design)] if design else []))


def classifier_for(ctx, cfg: QualityConfig, name: str, *, good: list, bad: list, labels: list,
                   encoder: str | None, train_only: bool):
    """The classifier artifact: trained on the named examples, else one trained before."""
    if good or bad or labels:
        return train_classifier(ctx, cfg, name, good=good, bad=bad, labels=labels,
                                encoder=encoder)
    if train_only:
        raise UserError("--train-only trains a classifier: name its examples with --good A "
                        "--bad B, or --labels FILE")
    return existing_classifier(ctx.workspace, name)


def assemble(out_dir: Path, done: dict) -> Assembled:
    counts = done["filter"].assemble(out_dir)
    quality, codes, groups = done["score"].collect()
    reasons = done["filter"].split.reasons  # the score_filter.PartFilter's
    return Assembled({**counts.stats(), "quality": quality_stats(quality, codes, reasons, groups)},
                     counts.first_removed)


def kept_by_design(cfg: QualityConfig) -> str | None:
    """The share of rows the settings remove on purpose, in words (None with min_quality)."""
    if cfg.min_quality is not None:
        return None
    per = f" of each {cfg.group_by}" if cfg.group_by else ""
    return f"kept the top {cfg.keep_top:.0%}{per} by quality, by design"


def quality_stats(quality: np.ndarray, codes: np.ndarray, reasons: np.ndarray,
                  groups: list) -> dict:
    """Median and mean quality, and per group the rows kept and the lowest quality kept."""
    out = scored_median_mean(quality)
    per_group = {}
    for g, value in enumerate(groups):
        kept = (codes == g) & (reasons == 0)
        per_group[json.dumps(value) if not isinstance(value, str) else value] = {
            "kept": int(kept.sum()), "rows": int((codes == g).sum()),
            "lowest_kept": float(quality[kept].min()) if kept.any() else None}
    out["groups"] = per_group
    return out
