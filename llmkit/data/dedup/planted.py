"""A generated corpus with planted duplicates and known truth, for tests and benchmarks.

Each original may get exact copies, edited copies (a share of its words substituted,
deleted or inserted) and look-alikes (its first 30–60 % of words, then different text of
the same length: similar-looking, not duplicates). English-like text is Zipf-distributed
made-up words with sentence case and punctuation; Chinese-like text is Zipf-distributed
Han characters grouped in 1–3-character words, written without spaces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class PlantedCorpus:
    texts: list[str] = field(default_factory=list)
    truth: list[int] = field(default_factory=list)  # documents sharing a value are duplicates
    kinds: list[str] = field(default_factory=list)  # original|exact|edited|lookalike|unique
    edit_rates: list[float] = field(default_factory=list)  # share of words edited (copies)
    source_of: list[int] = field(default_factory=list)  # index of the original, or -1

    def __len__(self) -> int:
        return len(self.texts)


class _Language:
    def __init__(self, lang: str, rng: np.random.Generator):
        self.lang = lang
        self.rng = rng
        if lang == "en":
            letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
            freq = 1.0 / np.arange(1, 27) ** 0.7
            n_vocab = 30000
            lengths = rng.integers(2, 10, n_vocab)
            pool = rng.choice(letters, lengths.sum(), p=freq / freq.sum())
        elif lang == "zh":
            chars = np.array([chr(c) for c in range(0x4E00, 0x4E00 + 3000)])
            n_vocab = 30000
            lengths = rng.choice([1, 2, 2, 2, 3], n_vocab)
            pool = rng.choice(chars, lengths.sum())
        else:
            raise ValueError(f"lang must be 'en' or 'zh', got {lang!r}")
        ends = np.cumsum(lengths)
        self.vocab = ["".join(pool[e - k:e]) for e, k in zip(ends, lengths)]
        weights = 1.0 / np.arange(1, n_vocab + 1) ** 1.05
        self.cdf = np.cumsum(weights / weights.sum())

    def words(self, n: int) -> list[str]:
        picks = np.searchsorted(self.cdf, self.rng.random(n) * self.cdf[-1])
        return [self.vocab[i] for i in picks]

    def render(self, words: list[str], seed: int) -> str:
        """Words -> text with sentences; punctuation placement is fixed by `seed` and the
        word count so an edited copy differs only by its edited words."""
        rng = np.random.default_rng(seed)
        sentence_lengths = rng.integers(6, 20, len(words) // 6 + 2)
        out, i = [], 0
        for length in sentence_lengths:
            part = words[i:i + length]
            if not part:
                break
            i += length
            if self.lang == "en":
                s = " ".join(part)
                out.append(s[0].upper() + s[1:] + ".")
            else:
                out.append("".join(part[:len(part) // 2]) + "，" + "".join(part[len(part) // 2:])
                           + "。")
        return (" " if self.lang == "en" else "").join(out)


def edit_words(words: list[str], rate: float, lang: _Language) -> list[str]:
    """Substitute, delete or insert round(rate × len) words at random positions."""
    rng = lang.rng
    out = list(words)
    n_edits = max(1, round(rate * len(words)))
    for _ in range(n_edits):
        op = rng.integers(3)
        pos = int(rng.integers(len(out)))
        if op == 0:
            out[pos] = lang.words(1)[0]
        elif op == 1 and len(out) > 1:
            del out[pos]
        else:
            out.insert(pos, lang.words(1)[0])
    return out


def planted_corpus(n_originals: int, *, lang: str = "en", words: tuple[int, int] = (200, 400),
                   exact_copies: float = 0.3, edited_copies: float = 1.0,
                   edit_rate: tuple[float, float] = (0.03, 0.10), lookalikes: float = 0.3,
                   prefix: tuple[float, float] = (0.3, 0.6), unique: int = 0,
                   seed: int = 0) -> PlantedCorpus:
    """`n_originals` originals, each with on average `exact_copies` exact copies,
    `edited_copies` edited copies and `lookalikes` look-alikes (Poisson counts), plus
    `unique` documents without duplicates; shuffled, so a copy may come before its original."""
    rng = np.random.default_rng(seed)
    lang_ = _Language(lang, rng)
    docs: list[tuple[str, int, str, float, int]] = []
    next_cluster = 0
    for o in range(n_originals):
        base = lang_.words(int(rng.integers(words[0], words[1] + 1)))
        layout = int(rng.integers(1 << 30))
        original = lang_.render(base, layout)
        cluster, next_cluster = next_cluster, next_cluster + 1
        docs.append((original, cluster, "original", 0.0, -1))
        for _ in range(rng.poisson(exact_copies)):
            docs.append((original, cluster, "exact", 0.0, o))
        for _ in range(rng.poisson(edited_copies)):
            rate = float(rng.uniform(*edit_rate))
            docs.append((lang_.render(edit_words(base, rate, lang_), layout), cluster, "edited",
                         rate, o))
        for _ in range(rng.poisson(lookalikes)):
            keep = int(len(base) * rng.uniform(*prefix))
            text = lang_.render(base[:keep] + lang_.words(len(base) - keep), layout)
            docs.append((text, next_cluster, "lookalike", 0.0, o))
            next_cluster += 1
    for _ in range(unique):
        text = lang_.render(lang_.words(int(rng.integers(words[0], words[1] + 1))),
                            int(rng.integers(1 << 30)))
        docs.append((text, next_cluster, "unique", 0.0, -1))
        next_cluster += 1
    order = rng.permutation(len(docs))
    corpus = PlantedCorpus()
    position = {int(old): new for new, old in enumerate(order)}
    originals = [i for i, d in enumerate(docs) if d[2] == "original"]
    for old in order:
        text, cluster, kind, rate, source = docs[old]
        corpus.texts.append(text)
        corpus.truth.append(cluster)
        corpus.kinds.append(kind)
        corpus.edit_rates.append(rate)
        corpus.source_of.append(position[originals[source]] if source >= 0 else -1)
    return corpus


def pair_scores(truth, predicted) -> tuple[float, float]:
    """(precision, recall) over document pairs: a pair is positive when both documents share
    a cluster label. Counted from cluster sizes, never by listing pairs."""
    truth = np.asarray(truth, np.int64)
    predicted = np.asarray(predicted, np.int64)

    def pairs(*labels):
        _, counts = np.unique(np.stack(labels, axis=1), axis=0, return_counts=True)
        return float((counts * (counts - 1) // 2).sum())

    both, true_pairs, found_pairs = pairs(truth, predicted), pairs(truth), pairs(predicted)
    precision = both / found_pairs if found_pairs else 1.0
    recall = both / true_pairs if true_pairs else 1.0
    return precision, recall
