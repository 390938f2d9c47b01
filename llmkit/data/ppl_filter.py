"""`llmkit ppl-filter`: keep the documents a reference language model finds natural (CCNet).

Two passes over the input dataset:
1. score: every document's perplexity under the scoring model — an llmkit checkpoint (`--model`,
   batched, sliding window for long documents) or a KenLM model (`backend: kenlm`, the CCNet
   convention: lines normalised, split into sentencepiece pieces when `kenlm_tokenizer` is
   given, scored by `kenlm.Model.score`). A task per input part; scores of finished batches
   are kept in the workspace's scratch folder, so a killed run resumes where it stopped.
2. filter: rows get a `ppl` column; a row is removed when its perplexity is above `max_ppl`
   (reason `ppl_above_threshold`), or, without a threshold, when it falls in a bucket not in
   `keep_buckets` (reason `ppl_bucket_<bucket>`). Buckets are CCNet's: head below the first
   percentile of the whole dataset (or of the row's `group_by` value: source, lang…), middle
   below the second, tail above. A task per input part again, given the percentiles of all
   the scores. Both passes are llmkit.data.score_filter's, which quality shares.

Perplexity is exp(negative log-likelihood / units). With an llmkit model the units are `byte`s of
UTF-8 text by default: per byte, random characters of any script score above real text of any
script, where per token they may not (a rare Han character falls back to three predictable byte
tokens). `unit: token` gives the usual per-token perplexity. The document is scored as in
`llmkit eval`: after `</s>` and followed by it. `max_chars` scores a prefix only: a ranking
needs no more, and long documents then cost what short ones do.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np

from llmkit.data.driver import Assembled, DataConfig, DataStage, run_data_stage
from llmkit.data.io import dataset_files
from llmkit.data.score_filter import ScoreFilter, scored_median_mean
from llmkit.errors import ConfigError, UserError
from llmkit.data.input_files import eval_input, resolve_checkpoint
from llmkit.core.executor import worker_slot
from llmkit.model.lm_scoring import LMScorer, text_documents
from llmkit.checkpoints.loading import load

BUCKETS = ("head", "middle", "tail")
REASONS = (None, "ppl_above_threshold", *(f"ppl_bucket_{b}" for b in BUCKETS))


@dataclass
class PplFilterConfig(DataConfig):
    backend: Literal["model", "kenlm"] = "model"  # model: the --model checkpoint; kenlm: kenlm_model
    max_ppl: float | None = None    # keep rows with ppl ≤ this; null = keep by percentile buckets
    keep_buckets: list[str] = field(default_factory=lambda: ["head", "middle"])  # buckets that stay
    percentiles: list[float] = field(default_factory=lambda: [30.0, 60.0])  # head | middle | tail edges
    group_by: str | None = None     # percentiles per value of this column (source, lang); null = whole dataset
    unit: Literal["byte", "token"] = "byte"  # perplexity per UTF-8 byte or per model token (backend model)
    model_step: str | None = None   # step folder of --model (null: its latest; the output records the one used)
    max_chars: int | None = None    # score each document's first this many characters (null: all of it)
    window: int | None = None       # tokens per forward pass; null = the model's max_seq_len
    stride: int | None = None       # a long document's windows advance by this; null = 3/4 window
    batch_rows: int = 256           # documents scored per step
    batch_tokens: int = 8192        # padded tokens per forward pass
    device: str = "auto"            # auto = cuda when available, else cpu
    dtype: str = "float32"          # float32 | bfloat16 | float16 (autocast while scoring)
    kenlm_model: str | None = None  # .arpa / .bin KenLM model (backend kenlm)
    kenlm_tokenizer: str | None = None  # sentencepiece .model the KenLM model was trained on (CCNet's lm_sp)

    def __post_init__(self):
        if self.max_ppl is not None and self.max_ppl <= 0:
            raise ConfigError(f"max_ppl must be > 0, got {self.max_ppl}")
        bad = [b for b in self.keep_buckets if b not in BUCKETS]
        if bad or not self.keep_buckets:
            raise ConfigError(f"keep_buckets must be a non-empty subset of {', '.join(BUCKETS)}, "
                              f"got {self.keep_buckets}")
        p = self.percentiles
        if len(p) != 2 or not 0 < p[0] < p[1] < 100:
            raise ConfigError(f"percentiles must be two increasing values in (0, 100), got {p}")
        if self.backend == "kenlm" and not self.kenlm_model:
            raise ConfigError("backend=kenlm needs kenlm_model=<path to .arpa or .bin>")
        if self.batch_rows < 1 or self.batch_tokens < 1:
            raise ConfigError("batch_rows and batch_tokens must be ≥ 1")
        if self.max_chars is not None and self.max_chars < 1:
            raise ConfigError(f"max_chars must be ≥ 1 or null, got {self.max_chars}")
        if (self.window is not None and self.window < 2) or (
                self.stride is not None and not 1 <= self.stride < (self.window or self.stride + 1)):
            raise ConfigError(f"need window ≥ 2 and 1 ≤ stride < window, got window={self.window}, "
                              f"stride={self.stride}")


# -- scorers: texts -> (negative log-likelihood in nats, units) ------------------------------------

class ModelScorer:
    """An llmkit causal LM and its tokenizer."""

    def __init__(self, model, tokenizer, cfg: PplFilterConfig):
        self.lm = LMScorer(model, device=cfg.device, dtype=cfg.dtype, batch_tokens=cfg.batch_tokens)
        self.tokenizer, self.cfg = tokenizer, cfg

    def score(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        window = min(self.cfg.window or self.lm.max_len, self.lm.max_len)
        # a filter needs a ranking, not the best estimate: less overlap, less compute
        stride = self.cfg.stride or max(1, window * 3 // 4)
        nll, tokens = self.lm.document_nll(text_documents(self.tokenizer, texts), window, stride)
        if self.cfg.unit == "token":
            return nll, tokens
        return nll, np.array([len(t.encode("utf-8")) for t in texts])


def ccnet_normalize(line: str) -> str:
    """The core of CCNet's normalisation before KenLM (its text_normalizer): lowercase, accents
    stripped, digits -> 0."""
    import unicodedata

    line = unicodedata.normalize("NFD", line.strip().lower())
    line = "".join(c for c in line if unicodedata.category(c) != "Mn")
    return "".join("0" if c.isdigit() else c for c in line)


class KenLMScorer:
    """A KenLM model scoring each non-empty line (with <s> and </s>), as CCNet does: the
    document's perplexity is 10 ** (−Σ log10 p / Σ (pieces + 1))."""

    def __init__(self, cfg: PplFilterConfig):
        try:
            import kenlm
        except ImportError:
            raise UserError("backend=kenlm needs the `kenlm` Python module, which is not installed: "
                            "`pip install https://github.com/kpu/kenlm/archive/master.zip` (it compiles "
                            "C++), or use backend=model with --model RUN") from None
        if not Path(cfg.kenlm_model).is_file():
            raise UserError(f"kenlm_model {cfg.kenlm_model} does not exist")
        self.model = kenlm.Model(str(cfg.kenlm_model))
        self.sp = None
        if cfg.kenlm_tokenizer:
            import sentencepiece as spm

            self.sp = spm.SentencePieceProcessor(model_file=str(cfg.kenlm_tokenizer))

    def score(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        nll, units = np.zeros(len(texts)), np.zeros(len(texts), dtype=np.int64)
        for i, text in enumerate(texts):
            for line in (text or "").split("\n"):
                line = ccnet_normalize(line)
                if not line:
                    continue
                if self.sp is not None:
                    line = " ".join(self.sp.encode(line, out_type=str))
                nll[i] -= self.model.score(line, bos=True, eos=True) * math.log(10)
                units[i] += len(line.split()) + 1  # the pieces and </s>
        return nll, units


def perplexities(nll: np.ndarray, units: np.ndarray) -> np.ndarray:
    """exp(nll / units); NaN for a document with nothing to score (an empty text)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(units > 0, np.exp(nll / np.maximum(units, 1)), np.nan)


@dataclass(frozen=True)
class PplScoring:
    """The `score_filter.Scoring` of ppl-filter: perplexities of each text's first `max_chars`."""
    cfg: PplFilterConfig
    model: object  # the scoring model's Artifact (None for KenLM)
    step: str | None

    def key(self) -> tuple:
        return str(getattr(self.model, "path", None)), self.step, self.cfg.backend

    def open(self):
        """The scoring model, on this process's device."""
        return open_scorer(task_config(self.cfg), self.model, self.step)

    def score(self, texts: list, scorer) -> np.ndarray:
        return perplexities(*scorer().score([(t or "")[:self.cfg.max_chars] for t in texts]))


def task_config(cfg: PplFilterConfig) -> PplFilterConfig:
    """The config a scoring process uses: in a local pool of --workers processes each takes a
    GPU of its own (`cuda:<slot % GPUs>`), or its share of the CPU's threads."""
    slot = worker_slot()
    if slot is None or cfg.backend != "model":
        return cfg
    import torch

    index, n = slot
    if cfg.device in ("auto", "cuda") and torch.cuda.is_available():
        return dataclasses.replace(cfg, device=f"cuda:{index % torch.cuda.device_count()}")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // n))
    return cfg


# -- decisions ---------------------------------------------------------------------------------

def bucket_edges(ppl: np.ndarray, codes: np.ndarray, percentiles: list[float]) -> np.ndarray:
    """[groups, 2]: the two percentiles of each group's scored (non-NaN) perplexities."""
    n_groups = int(codes.max()) + 1 if len(codes) else 0
    edges = np.full((n_groups, 2), np.inf)
    order = np.argsort(codes, kind="stable")
    for g, rows in enumerate(np.split(order, np.cumsum(np.bincount(codes, minlength=n_groups))[:-1])):
        values = ppl[rows]
        values = values[~np.isnan(values)]
        if len(values):
            edges[g] = np.percentile(values, percentiles)
    return edges


def removal_codes(ppl: np.ndarray, codes: np.ndarray, edges: np.ndarray | None,
                  cfg: PplFilterConfig) -> np.ndarray:
    """Each row's index into REASONS (0: kept): above max_ppl, or in a bucket not kept (`edges`
    from bucket_edges). An unscorable (empty) document is kept: emptiness is clean's business."""
    if cfg.max_ppl is not None:
        return (ppl > cfg.max_ppl).astype(np.int8)  # NaN > x is False: kept
    bucket = np.where(ppl < edges[codes, 0], 0, np.where(ppl < edges[codes, 1], 1, 2))
    keep = np.isin(bucket, [BUCKETS.index(b) for b in cfg.keep_buckets]) | np.isnan(ppl)
    return np.where(keep, 0, 2 + bucket).astype(np.int8)


def removal_reasons(ppl: np.ndarray, codes: np.ndarray, edges: np.ndarray | None,
                    cfg: PplFilterConfig) -> list:
    """`removal_codes` in words (None = kept)."""
    return [REASONS[c] for c in removal_codes(ppl, codes, edges, cfg)]


def decide(ppl: np.ndarray, codes: np.ndarray, *, cfg: PplFilterConfig) -> np.ndarray:
    """The filter's decision over the whole dataset (the buckets' edges from all its scores)."""
    edges = None if cfg.max_ppl is not None else bucket_edges(ppl, codes, cfg.percentiles)
    return removal_codes(ppl, codes, edges, cfg)


def scoring_input(ws, cfg: PplFilterConfig, model: str | None):
    """(artifact of the scoring model, for the fingerprint; its step folder, or None for KenLM)."""
    if cfg.backend == "kenlm":
        return eval_input(ws, cfg.kenlm_model), None
    if not model:
        raise UserError("ppl-filter needs a scoring model: --model RUN (a checkpoint run), or "
                        "--set backend=kenlm --set kenlm_model=PATH")
    if Path(model).suffix in (".arpa", ".bin") and Path(model).is_file():
        raise UserError(f"--model takes a checkpoint run; {model} looks like a KenLM model: use "
                        f"--set backend=kenlm --set kenlm_model={model}")
    return resolve_checkpoint(ws, model, cfg.model_step)


def open_scorer(cfg: PplFilterConfig, model_art, step: str | None):
    if cfg.backend == "kenlm":
        return KenLMScorer(cfg)
    return ModelScorer(*load(model_art.path / step), cfg)


def run_ppl_filter(ctx, cfg: PplFilterConfig, model: str | None = None):
    """Score, then filter (llmkit.data.score_filter: perplexity buckets need every score
    first). A --rank run does its share of the scoring, and of the filtering once every part
    is scored; a plain run does what is left and commits."""
    src = ctx.input("dedup")
    model_art, step = scoring_input(ctx.workspace, cfg, model)
    cfg = dataclasses.replace(cfg, model_step=step)
    stage = ScoreFilter("ppl-filter", "ppl", REASONS, PplScoring(cfg, model_art, step),
                        partial(decide, cfg=cfg), cfg.group_by, cfg.batch_rows)
    design = kept_by_design(cfg)
    return run_data_stage(ctx, DataStage(
        "ppl-filter", cfg, [src, model_art], "filtered", stage.phases(dataset_files(src.path)),
        partial(assemble, cfg=cfg), source=str(src.path),
        notes=[("policy", design)] if design else []))


def assemble(out_dir: Path, done: dict, *, cfg: PplFilterConfig) -> Assembled:
    counts = done["filter"].assemble(out_dir)
    ppl, codes, groups = done["score"].collect()
    stats = scored_median_mean(ppl)
    if cfg.max_ppl is None:
        edges = bucket_edges(ppl, codes, cfg.percentiles)
        stats["bucket_edges"] = {str(g): edges[k].tolist() for k, g in enumerate(groups)}
    return Assembled({**counts.stats(), "ppl": stats}, counts.first_removed)


def kept_by_design(cfg: PplFilterConfig) -> str | None:
    """The share of rows the bucket settings remove on purpose, in words (None for max_ppl):
    a run that drops 40% of the rows by default should say that it meant to."""
    if cfg.max_ppl is not None:
        return None
    lo, hi = cfg.percentiles
    width = {"head": lo, "middle": hi - lo, "tail": 100 - hi}
    kept = [b for b in BUCKETS if b in cfg.keep_buckets]
    per = f" of each {cfg.group_by}" if cfg.group_by else ""
    return (f"kept {'+'.join(kept)} buckets (percentiles {lo:g}/{hi:g}{per}): "
            f"{sum(width[b] for b in kept):g}% of rows by design")
