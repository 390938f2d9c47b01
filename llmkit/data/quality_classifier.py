"""The quality classifiers `llmkit quality` trains offline and scores with: texts -> P(good).

Two backends:
- `fasttext` (the default): a fastText linear model on words and word bigrams; Chinese is cut
  into characters (so bigrams are character pairs), digits fold to 0, line ends are a token.
  One thread and a fixed seed make training deterministic: the same examples and seed give the
  same model bytes. Scored from the sentence vector and the output matrix (fastText's own
  `predict` returns broken probabilities under numpy 2, and saturates at 1.0 in float32).
- `hidden`: a logistic-regression head on the mean-pooled final hidden states of an llmkit (or
  imported) checkpoint, `--encoder RUN`. Full-batch L-BFGS from zero in float64: deterministic.

A classifier folder holds `classifier.json` (backend, settings, the encoder it needs) and the
model (`model.bin`, or `head.safetensors`). `load_classifier` gives an object with
`score(texts) -> float64 array`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmkit.tokenizers.cjk import CJK_RANGES
from llmkit.data.quality_labels import read_examples, require_both_classes
from llmkit.errors import ConfigError, UserError
from llmkit.model.lm_scoring import LMScorer
from llmkit.checkpoints.loading import load

INFO = "classifier.json"
FASTTEXT_MODEL = "model.bin"
HEAD = "head.safetensors"
TEXT_FORMAT = 1  # how texts become fastText tokens; a change makes old classifiers refuse to load


@dataclass
class FastTextConfig:
    dim: int = 32              # vector size
    epoch: int = 5             # passes over the examples
    lr: float = 0.5            # learning rate
    word_ngrams: int = 2       # word (Chinese: character) n-grams; 2 adds bigrams
    bucket: int = 100_000      # hash buckets of the n-grams (model size: bucket × dim × 4 bytes)
    min_count: int = 1         # words seen fewer times are dropped

    def __post_init__(self):
        for key in ("dim", "epoch", "word_ngrams", "bucket", "min_count"):
            if getattr(self, key) < 1:
                raise ConfigError(f"fasttext.{key} must be ≥ 1, got {getattr(self, key)}")
        if self.lr <= 0:
            raise ConfigError(f"fasttext.lr must be > 0, got {self.lr}")


@dataclass
class HiddenConfig:
    max_tokens: int = 128      # tokens of each document pooled (its first ones)
    l2: float = 1.0e-3         # L2 penalty of the head (on standardised features)
    iterations: int = 200      # L-BFGS iterations
    batch_tokens: int = 8192   # padded tokens per forward pass
    device: str = "auto"       # auto = cuda when available, else cpu
    dtype: str = "float32"     # float32 | bfloat16 | float16 (autocast while encoding)

    def __post_init__(self):
        if self.max_tokens < 1 or self.iterations < 1 or self.batch_tokens < 1:
            raise ConfigError("hidden.max_tokens, hidden.iterations and hidden.batch_tokens "
                              "must be ≥ 1")
        if self.l2 < 0:
            raise ConfigError(f"hidden.l2 must be ≥ 0, got {self.l2}")


# -- fastText ---------------------------------------------------------------------------------

_TABLE: list = []


def token_table() -> list:
    """str.translate table of the BMP, indexed by code point: each CJK character and each
    punctuation mark or symbol becomes a token of its own, digits fold to 0, a line end is the
    token ¶, other characters stay. A list, not a dict: translate then runs at ~30 MB/s, twice
    a dict's speed and eight times a regex's (characters past the BMP stay as they are)."""
    if not _TABLE:
        import unicodedata

        cjk = {c for lo, hi in CJK_RANGES for c in range(lo, min(hi, 0xFFFF) + 1)}
        _TABLE.extend(f" {chr(c)} " if c in cjk or unicodedata.category(chr(c))[0] in "PS"
                      else chr(c) for c in range(0x10000))
        for d in "123456789":
            _TABLE[ord(d)] = "0"
        for c in "\r\x00\x0b\x0c":
            _TABLE[ord(c)] = " "
        _TABLE[ord("\n")] = " ¶ "
    return _TABLE


def fasttext_text(text: str, max_chars: int) -> str:
    return text[:max_chars].lower().translate(token_table())


class FastTextClassifier:
    def __init__(self, folder: Path, info: dict):
        import fasttext.FastText

        # _FastText directly: fasttext.load_model prints a warning on every load
        self.model = fasttext.FastText._FastText(model_path=str(folder / FASTTEXT_MODEL))
        out = self.model.get_output_matrix()
        labels = self.model.get_labels()
        self.direction = out[labels.index("__label__good")] - out[labels.index("__label__bad")]
        self.max_chars = info["max_chars"]

    def score(self, texts: list[str]) -> np.ndarray:
        import fasttext_pybind

        # the binding itself, with one buffer: the wrapper's checks cost a tenth of the time
        buffer = fasttext_pybind.Vector(len(self.direction))
        sentence_vector = self.model.f.getSentenceVector
        vectors = np.empty((len(texts), len(self.direction)), dtype=np.float32)
        for i, text in enumerate(texts):
            sentence_vector(buffer, fasttext_text(text, self.max_chars) + "\n")
            vectors[i] = buffer
        return sigmoid((vectors @ self.direction).astype(np.float64))


def train_fasttext(texts: list[str], labels: np.ndarray, cfg: FastTextConfig, *, seed: int,
                   max_chars: int, work: Path, out: Path) -> None:
    """`out/model.bin`, trained on one thread in the examples' order (shuffled by `seed`)."""
    import fasttext

    order = np.random.default_rng(seed).permutation(len(texts))
    train_file = work / "fasttext-train.txt"
    with open(train_file, "w", encoding="utf-8") as f:
        for i in order:
            label = "good" if labels[i] else "bad"
            f.write(f"__label__{label} {fasttext_text(texts[i], max_chars)}\n")
    model = fasttext.train_supervised(
        input=str(train_file), dim=cfg.dim, epoch=cfg.epoch, lr=cfg.lr,
        wordNgrams=cfg.word_ngrams, bucket=cfg.bucket, minCount=cfg.min_count, minn=0, maxn=0,
        loss="softmax", thread=1, seed=seed, verbose=0)
    model.save_model(str(out / FASTTEXT_MODEL))
    train_file.unlink()


# -- a head on an LM's hidden states ------------------------------------------------------------

class HiddenHeadClassifier:
    def __init__(self, folder: Path, info: dict, encoder=None):
        from safetensors.numpy import load_file

        head = load_file(str(folder / HEAD))
        self.weight, self.bias = head["weight"], float(head["bias"][0])
        self.mean, self.std = head["mean"], head["std"]
        self.encoder = encoder or HiddenStates.open(info["encoder"], info)

    def score(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0)
        return self.score_features(self.encoder.features(texts))

    def score_features(self, features: np.ndarray) -> np.ndarray:
        return sigmoid((features - self.mean) / self.std @ self.weight + self.bias)


class HiddenStates:
    """Mean-pooled final hidden states of a causal LM over each text's first tokens."""

    def __init__(self, model, tokenizer, cfg: HiddenConfig, max_chars: int):
        self.lm = LMScorer(model, device=cfg.device, dtype=cfg.dtype, batch_tokens=cfg.batch_tokens)
        self.tokenizer, self.cfg, self.max_chars = tokenizer, cfg, max_chars
        self.max_tokens = min(cfg.max_tokens, self.lm.max_len)

    @classmethod
    def open(cls, encoder: dict, info: dict) -> HiddenStates:
        path = Path(encoder["path"]) / encoder["step"]
        if not path.is_dir():
            raise UserError(f"the quality classifier needs its encoder {path}, which is gone; "
                            f"retrain the classifier")
        return cls(*load(path), HiddenConfig(**info["hidden"]), info["max_chars"])

    def features(self, texts: list[str]) -> np.ndarray:
        import torch

        docs = [ids[:self.max_tokens] or [self.tokenizer.eos_id] for ids in
                self.tokenizer.encode_batch([t[:self.max_chars] for t in texts])]
        out = np.zeros((len(docs), self.lm.model.config.hidden_size), dtype=np.float64)
        for batch in length_batches(docs, self.cfg.batch_tokens):
            width = len(docs[batch[0]])
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width, 1))
            for r, i in enumerate(batch):
                ids[r, :len(docs[i])] = torch.tensor(docs[i])
                mask[r, :len(docs[i])] = 1
            with torch.inference_mode(), self.lm.autocast():
                # right padding: causal attention keeps it from reaching a real token
                hidden = self.lm.model.hidden_states(ids.to(self.lm.device)).float().cpu()
            out[batch] = ((hidden * mask).sum(1) / mask.sum(1)).double().numpy()
        return out


def length_batches(docs: list, batch_tokens: int) -> list[list[int]]:
    """Indices of `docs`, longest first, cut into batches of at most `batch_tokens` padded
    tokens (a longer document alone)."""
    batches: list[list[int]] = []
    for i in sorted(range(len(docs)), key=lambda i: -len(docs[i])):
        if batches and (len(batches[-1]) + 1) * len(docs[batches[-1][0]]) <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def train_head(features: np.ndarray, labels: np.ndarray, cfg: HiddenConfig, out: Path) -> None:
    """Logistic regression on standardised features: `out/head.safetensors`."""
    import torch
    from safetensors.numpy import save_file

    mean = features.mean(0)
    std = features.std(0) + 1e-6
    x = torch.from_numpy((features - mean) / std)
    y = torch.from_numpy(labels.astype(np.float64))
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=cfg.iterations, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        value = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y) + \
            cfg.l2 * (w * w).sum()
        value.backward()
        return value

    opt.step(loss)
    save_file({"weight": w.detach().numpy(), "bias": b.detach().numpy(), "mean": mean,
               "std": std}, str(out / HEAD))


# -- both ---------------------------------------------------------------------------------------

def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -700, 700)))


def load_classifier(folder: Path, encoder=None):
    """The scorer of a classifier folder (`encoder`: a HiddenStates already open, to reuse)."""
    folder = Path(folder)
    try:
        info = json.loads((folder / INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UserError(f"{folder} is not a quality classifier (no readable {INFO}); train one "
                        "with `llmkit quality --good A --bad B`") from None
    if info.get("text_format") != TEXT_FORMAT:
        raise UserError(f"{folder} was trained by another llmkit (text format "
                        f"{info.get('text_format')}, this one reads {TEXT_FORMAT}); retrain it")
    if info["backend"] == "fasttext":
        return FastTextClassifier(folder, info)
    return HiddenHeadClassifier(folder, info, encoder)


def auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """Area under the ROC curve (ties count half); None without both classes."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if not n_pos or not n_neg:
        return None
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = np.bincount(inverse, ranks)[inverse] / counts[inverse]  # ties: their mean rank
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def holdout_split(labels: np.ndarray, share: float, seed: int) -> np.ndarray:
    """A boolean mask of the held-out examples: `share` of each class, chosen by `seed`."""
    held = np.zeros(len(labels), dtype=bool)
    rng = np.random.default_rng(seed)
    for cls in (0, 1):
        rows = np.flatnonzero(labels == cls)
        take = math.floor(share * len(rows))
        held[rng.permutation(rows)[:take]] = True
    return held


# -- training -----------------------------------------------------------------------------------

def fit_classifier(examples: dict, cfg, out: Path, work: Path, *, encoder=(None, None)) -> dict:
    """Train a classifier of backend `cfg.backend` on the labelled examples (`examples`: artifacts
    by kind, good / bad / labels) into the folder `out`, minus `cfg.holdout` of each class,
    on which it is measured. Returns what `classifier.json` says, with `stats`."""

    ex = read_examples(examples["good"], examples["bad"], examples["labels"],
                       label_column=cfg.label_column, label_threshold=cfg.label_threshold)
    require_both_classes(ex, ", ".join(str(a.path) for arts in examples.values() for a in arts))
    labels = ex.label_array()
    held = holdout_split(labels, cfg.holdout, cfg.seed)
    train = np.flatnonzero(~held)
    info = {"backend": cfg.backend, "text_format": TEXT_FORMAT, "max_chars": cfg.max_chars,
            "seed": cfg.seed}
    if cfg.backend == "fasttext":
        info["fasttext"] = dataclasses.asdict(cfg.fasttext)
        train_fasttext([ex.texts[i] for i in train], labels[train], cfg.fasttext, seed=cfg.seed,
                       max_chars=cfg.max_chars, work=work, out=out)
        scorer = FastTextClassifier(out, info)
        held_scores = scorer.score([t for t, h in zip(ex.texts, held) if h])
    else:
        run, step = encoder
        info["hidden"] = dataclasses.asdict(cfg.hidden)
        info["encoder"] = {"path": str(Path(run.path).resolve()), "step": step,
                           "fingerprint": run.fingerprint}
        states = HiddenStates.open(info["encoder"], info)
        features = states.features(ex.texts)
        train_head(features[train], labels[train], cfg.hidden, out)
        held_scores = HiddenHeadClassifier(out, info, states).score_features(features[held])
    langs = np.array(ex.langs)[held]
    info["stats"] = {**ex.stats(), "trained_on": len(train), "holdout": {
        "rows": int(held.sum()), "auc": auc(held_scores, labels[held]),
        "auc_by_lang": {lang: auc(held_scores[langs == lang], labels[held][langs == lang])
                        for lang in sorted(set(langs))}}}
    (out / INFO).write_text(json.dumps(info, indent=2, ensure_ascii=False), encoding="utf-8")
    return info
