"""Perplexity of documents: the val split of token shards, or any text tokenized by the run's tokenizer.

A document is scored as it appears in the token shards: after the `</s>` that ends the one
before, and followed by its own `</s>`. So its first token is predicted too, and every text
token plus the final `</s>` counts. Long documents use the sliding window of `LMScorer`
(llmkit.model.lm_scoring, with `text_documents`).
`ppl` is the corpus perplexity exp(Σ nll / Σ tokens); `bits_per_byte` (texts only) divides the
same log-likelihood by UTF-8 bytes instead, which compares across tokenizers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmkit.data.token_shards import read_index
from llmkit.errors import ConfigError, UserError
from llmkit.model.lm_scoring import text_documents
from llmkit.tokenizers.sentencepiece import same_tokenizer, tokenizer_file
from llmkit.core.workspace import Artifact


@dataclass
class PerplexityConfig:
    datasets: list[str] = field(default_factory=list)  # datasets / files whose `text` is scored too
    split: str = "val"          # split of the token artifact (`tokens`) that is scored
    window: int | None = None   # tokens per forward pass; None = the model's max_seq_len
    stride: int | None = None   # a long document's windows advance by this; None = window // 2
    max_docs: int = 1000        # score at most the first this many documents of each set

    def __post_init__(self):
        if self.split not in ("train", "val"):
            raise ConfigError(f"ppl.split must be train or val, got {self.split!r}")
        if self.window is not None and self.window < 2:
            raise ConfigError(f"ppl.window must be ≥ 2, got {self.window}")
        if self.stride is not None and not 1 <= self.stride < (self.window or self.stride + 1):
            raise ConfigError(f"ppl.stride must be in [1, window), got {self.stride}")
        if self.max_docs < 1:
            raise ConfigError(f"ppl.max_docs must be ≥ 1, got {self.max_docs}")


def split_documents(tokens_dir: Path, split: str, limit: int) -> tuple[list, list[str], int]:
    """The first `limit` documents of a token artifact's split as `[</s>] + tokens` (their own
    `</s>` included), their sources, and the `</s>` id."""
    stats = Artifact.open(tokens_dir).stats
    dtype, eos = np.dtype(stats["dtype"]), int(stats["eos_id"])
    docs, sources = [], []
    for path in sorted((Path(tokens_dir) / split).glob("shard-*.bin")):
        offsets, lengths, shard_sources = read_index(tokens_dir, int(path.stem.split("-")[1]), split)
        if not len(offsets):
            continue
        tokens = np.memmap(path, dtype=dtype, mode="r")
        for offset, length, source in zip(offsets.tolist(), lengths.tolist(), shard_sources):
            docs.append(np.concatenate([[eos], tokens[offset:offset + length]]).astype(np.int64))
            sources.append(source)
            if len(docs) == limit:
                return docs, sources, eos
    return docs, sources, eos


def perplexity_summary(nll: np.ndarray, counts: np.ndarray, sources: list[str] | None = None,
                       n_bytes: np.ndarray | None = None) -> dict:
    """Corpus perplexity of scored documents, overall and by source."""
    out = _summary(nll, counts, n_bytes)
    if sources is not None and len(set(sources)) > 1:
        groups = defaultdict(list)
        for i, s in enumerate(sources):
            groups[s].append(i)
        out["by_source"] = {s: _summary(nll[idx], counts[idx], None if n_bytes is None
                                        else n_bytes[idx]) for s, idx in sorted(groups.items())}
    return out


def _summary(nll, counts, n_bytes) -> dict:
    total, tokens = float(np.sum(nll)), int(np.sum(counts))
    if tokens == 0:
        raise UserError("nothing to score: every document is empty")
    out = {"ppl": math.exp(total / tokens), "nll_per_token": total / tokens,
           "tokens": tokens, "docs": int(len(counts))}
    if n_bytes is not None:
        out["bits_per_byte"] = total / math.log(2) / max(int(np.sum(n_bytes)), 1)
    return out


def require_same_tokenizer(tokens_dir: Path, tokenizer) -> None:
    """Token ids mean nothing to a model with another tokenizer: refuse to score them."""
    made_with = Path(tokens_dir) / "tokenizer"
    if tokenizer_file(made_with) is not None and not same_tokenizer(made_with, tokenizer.path):
        raise UserError(f"{tokens_dir} was tokenized with another tokenizer than the model's "
                        f"({tokenizer.path}); evaluate on its text instead: set tokens=null and "
                        "ppl.datasets=<the dataset>")


def token_split_perplexity(scorer, tokenizer, tokens_dir: Path, cfg: PerplexityConfig) -> dict:
    require_same_tokenizer(tokens_dir, tokenizer)
    docs, sources, _ = split_documents(Path(tokens_dir), cfg.split, cfg.max_docs)
    if not docs:
        raise UserError(f"{tokens_dir}: the {cfg.split} split has no documents; re-run "
                        "`llmkit tokenize` with a larger val_fraction, or score datasets instead")
    nll, counts = scorer.document_nll(docs, cfg.window, cfg.stride)
    return perplexity_summary(nll, counts, sources)


def text_perplexity(scorer, tokenizer, rows: list[dict], cfg: PerplexityConfig) -> dict:
    texts = [r.get("text") or "" for r in rows]
    nll, counts = scorer.document_nll(text_documents(tokenizer, texts), cfg.window, cfg.stride)
    n_bytes = np.array([len(t.encode("utf-8")) for t in texts])
    sources = [r.get("source") or "" for r in rows]
    return perplexity_summary(nll, counts, sources, n_bytes)
