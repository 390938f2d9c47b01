"""`llmkit tokenizer`: train the sentencepiece BPE model of a `Tokenizer` (llmkit.tokenizers.sentencepiece).

Training sees a bounded, order-independent sample of the input's sentences. Its settings keep
the round trip exact: identity normalisation, whitespace kept as is (and split_by_whitespace,
so no piece continues past a space after a non-space), byte fallback for every character left
out. The character coverage is planned here, not left to sentencepiece: a vocabulary too small
for the characters the requested coverage keeps gets a lower coverage (rarer characters become
bytes), or an error naming the smallest vocabulary that works. With `jieba=true`, Chinese runs
are trained with a tab at each jieba word boundary, so no piece crosses one.

After training, fertility (tokens per character and per word, by language) is measured on
documents held out of the sample. The stage itself, through the data driver, is
llmkit.data.train_tokenizer.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator

from llmkit.tokenizers.cjk import count_words, mark_jieba_boundaries
from llmkit.data.io import dataset_files
from llmkit.errors import ConfigError, UserError
from llmkit.core.executor import RunsOn, run_option
from llmkit.tokenizers.sentencepiece import (BOS, CHAT_TEMPLATE, END_OF_TURN, EOS, MODEL_FILE, PAD, ROLE_TOKENS, UNK,
                              WS_MARK, Tokenizer)

UNK_MARK = "\u2585"       # sentencepiece skips training sentences that contain it
TAB = "\t"                # never inside a trained piece: marks pretokenisation boundaries
MIN_COVERAGE = 0.98       # the lowest character_coverage sentencepiece accepts
N_BYTE_PIECES = 256


@dataclass
class TokenizerConfig:
    vocab_size: int = 32000             # pieces, including special tokens and the 256 bytes
    character_coverage: float = 0.9995  # share of characters kept as pieces; rarer: bytes
    input_sentence_size: int = 1_000_000  # at most this many training sentences (memory bound)
    max_sentence_chars: int = 4096      # documents are cut at newlines into sentences this long
    jieba: bool = False                 # segment Chinese with jieba before BPE
    extra_symbols: list[str] = field(default_factory=list)  # more never-split tokens
    heldout_fraction: float = 0.01      # documents kept out of training to measure fertility
    heldout_chars: int = 2_000_000      # at most this many held-out characters are measured
    seed: int = 0                       # picks the training sample and the held-out documents
    # a data stage's `run` section without DataConfig's allow_empty: no text, no tokenizer
    run: RunsOn = run_option()  # where its task runs; run.workers: sentencepiece's threads (not fingerprinted)

    def __post_init__(self):
        if self.vocab_size < 300:
            raise ConfigError(f"vocab_size must be ≥ 300 (256 byte pieces + specials), "
                              f"got {self.vocab_size}")
        if not MIN_COVERAGE <= self.character_coverage <= 1.0:
            raise ConfigError(f"character_coverage must be in [{MIN_COVERAGE}, 1], "
                              f"got {self.character_coverage}")
        if self.input_sentence_size < 101:
            raise ConfigError(f"input_sentence_size must be > 100, got {self.input_sentence_size}")
        if self.max_sentence_chars < 16:
            raise ConfigError(f"max_sentence_chars must be ≥ 16, got {self.max_sentence_chars}")
        if not 0.0 <= self.heldout_fraction < 0.5:
            raise ConfigError(f"heldout_fraction must be in [0, 0.5), got {self.heldout_fraction}")
        reserved = {UNK, BOS, EOS, PAD, *ROLE_TOKENS.values(), END_OF_TURN}
        for s in self.extra_symbols:
            if not s or s in reserved or any(c.isspace() for c in s) or WS_MARK in s:
                raise ConfigError(f"extra_symbols: {s!r} must be non-empty, without whitespace, "
                                  "and not one of the built-in special tokens")

    @property
    def user_symbols(self) -> list[str]:
        return [*ROLE_TOKENS.values(), END_OF_TURN, *self.extra_symbols]



# -- training -------------------------------------------------------------------------------

def _hash01(*parts) -> float:
    """A stable number in [0, 1) for the given values (sampling and held-out choices)."""
    import hashlib

    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8", "surrogatepass"),
                        digest_size=8)
    return int.from_bytes(h.digest(), "little") / 2.0 ** 64


def split_sentences(text: str, max_chars: int) -> list[str]:
    """`text` cut after newlines into pieces of at most `max_chars` (a longer line is cut)."""
    if len(text) <= max_chars:
        return [text] if text else []
    out, cur = [], ""
    for line in text.splitlines(keepends=True):
        while len(line) > max_chars:
            if cur:
                out.append(cur)
                cur = ""
            out.append(line[:max_chars])
            line = line[max_chars:]
        if len(cur) + len(line) > max_chars:
            out.append(cur)
            cur = ""
        cur += line
    if cur:
        out.append(cur)
    return out


class TrainingSample:
    """A bounded, order-independent sample of sentences (the `k` with the smallest hash)."""

    def __init__(self, k: int, seed: int):
        self.k, self.seed = k, seed
        self._heap: list[tuple[float, int, str]] = []
        self._n = 0
        self.sentences_seen = 0

    def add(self, doc_id: str, text: str, max_chars: int) -> None:
        for i, s in enumerate(split_sentences(text, max_chars)):
            if UNK_MARK in s:
                continue  # sentencepiece would skip it
            self.sentences_seen += 1
            key = -_hash01(self.seed, doc_id, i)
            self._n += 1
            item = (key, self._n, s)
            if len(self._heap) < self.k:
                heapq.heappush(self._heap, item)
            elif key > self._heap[0][0]:
                heapq.heapreplace(self._heap, item)

    def sentences(self) -> list[str]:
        return [s for _, _, s in sorted(self._heap, key=lambda t: (-t[0], t[1]))]


@dataclass
class CoveragePlan:
    requested: float      # the configured character_coverage
    used: float           # the coverage actually trained with (lower when the vocab is small)
    spm_value: float      # what sentencepiece is given (its own accounting of the text)
    required_chars: int   # distinct characters that become pieces
    byte_chars: int       # distinct characters of the sample left to byte fallback
    lowered: bool


def _sorted_counts(counts: Counter) -> list[tuple[str, int]]:
    # sentencepiece's order: most frequent first, ties by code point
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _required_chars(counts: Counter, coverage: float) -> int:
    """How many characters sentencepiece keeps at `coverage` (its float32 arithmetic)."""
    import numpy as np

    total = sum(counts.values())
    target, acc, n = np.float32(coverage), 0, 0
    for ch, c in _sorted_counts(counts):
        if np.float32(acc / total) >= target:
            break
        acc += c
        if ch != TAB:
            n += 1
    return n


def _coverage_keeping(counts: Counter, n_chars: int) -> float:
    """The coverage at which sentencepiece keeps the `n_chars` most frequent characters."""
    import numpy as np

    total, acc, n = sum(counts.values()), 0, 0
    for ch, c in _sorted_counts(counts):
        acc += c
        n += ch != TAB
        if n >= n_chars:
            return float(np.float32(acc / total))
    return 1.0


def plan_coverage(real: Counter, seen: Counter, cfg: TokenizerConfig,
                  spare: int = 0) -> CoveragePlan:
    """Pick the character coverage that fits the vocabulary, or say which vocabulary would.

    `real` counts the sample's characters; `seen` counts them as sentencepiece will (with
    jieba boundary marks); `spare` keeps that many pieces free. Raises UserError when even
    coverage 0.98 needs more pieces.
    """
    specials = 4 + len(cfg.user_symbols) + N_BYTE_PIECES
    budget = cfg.vocab_size - specials - spare
    wanted = _required_chars(real, cfg.character_coverage)
    if wanted <= budget:
        kept, used = wanted, cfg.character_coverage
    else:
        least = _required_chars(real, MIN_COVERAGE)
        if least > budget:
            raise UserError(
                f"vocab_size={cfg.vocab_size} is too small for this text: even at "
                f"character_coverage={MIN_COVERAGE} it needs {least} characters + {specials} "
                f"special and byte pieces. The smallest vocabulary that works is "
                f"{least + specials}: use --set vocab_size={least + specials} or larger")
        kept = budget
        total = sum(c for ch, c in real.items())
        used = sum(c for _, c in _sorted_counts(Counter(
            {ch: c for ch, c in real.items() if ch != TAB}))[:kept]) / total
        used = max(MIN_COVERAGE, min(cfg.character_coverage, used))
    spm_value = used if (seen == real and kept == wanted) else max(
        MIN_COVERAGE, _coverage_keeping(seen, kept))
    distinct = sum(1 for ch in real if ch != TAB)
    return CoveragePlan(cfg.character_coverage, used, spm_value, kept, distinct - kept,
                        kept < wanted)


def _spm_view(sentences: list[str], meta: list[str]) -> Counter:
    """Character counts as sentencepiece sees them: spaces are ▁, special tokens are tabs,
    and trailing line breaks are gone (its sentence reader strips them)."""
    counts: Counter = Counter()
    meta_re = re.compile("|".join(map(re.escape, sorted(meta, key=len, reverse=True))))
    for s in sentences:
        s = s.rstrip("\r\n")
        if "<" in s:
            s = meta_re.sub(TAB, s)
        counts.update(s)
    if " " in counts:
        counts[WS_MARK] += counts.pop(" ")
    counts.pop("\x00", None)
    return counts


def train_sentencepiece(sentences: list[str], cfg: TokenizerConfig, workers: int = 1,
                        log=print) -> tuple[bytes, CoveragePlan]:
    """Train the BPE model on `sentences`; returns the serialized model and the coverage used."""
    if not sentences:
        raise UserError("tokenizer: the input has no text to train on")
    meta = [UNK, BOS, EOS, PAD, *cfg.user_symbols] + [f"<0x{b:02X}>" for b in range(256)]
    real = _spm_view(sentences, meta)
    if cfg.jieba:
        sentences = [mark_jieba_boundaries(s, TAB) for s in sentences]
        seen = _spm_view(sentences, meta)
    else:
        seen = real
    spare = 0
    for attempt in range(3):
        plan = plan_coverage(real, seen, cfg, spare)
        try:
            model = _train_bpe(sentences, cfg, plan.spm_value, workers)
            break
        except RuntimeError as e:
            # our count of sentencepiece's alphabet is exact on every corpus we know; should
            # it ever be short, the error says by how much: keep that many more pieces free
            m = re.search(r"required_chars\. (\d+) vs (\d+)", str(e))
            if not m or attempt == 2:
                raise _user_error_of(e, cfg) from None
            spare += int(m.group(2)) - int(m.group(1))
    if plan.lowered:
        log(f"tokenizer: vocab_size={cfg.vocab_size} cannot hold the characters that "
            f"character_coverage={cfg.character_coverage} needs; lowered it to "
            f"{plan.used:.6f}, so {plan.byte_chars} rare characters fall back to UTF-8 bytes")
    return model, plan


def _train_bpe(sentences: list[str], cfg: TokenizerConfig, coverage: float,
               workers: int) -> bytes:
    import io

    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=out, model_type="bpe",
        vocab_size=cfg.vocab_size, character_coverage=coverage,
        byte_fallback=True, split_digits=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=False,
        allow_whitespace_only_pieces=True, split_by_whitespace=True,
        user_defined_symbols=cfg.user_symbols, unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        input_sentence_size=0, shuffle_input_sentence=False,
        max_sentence_length=4 * cfg.max_sentence_chars + 16,
        num_threads=max(1, min(workers, 128)), minloglevel=2)
    return _without_thread_count(out.getvalue())


def _without_thread_count(model: bytes) -> bytes:
    """The model file without the thread count sentencepiece writes into it: its BPE trainer
    uses threads only to normalise sentences (the pieces, their order and scores come from one
    thread, ties broken by length then bytes), so without that field the same text gives the same
    bytes at any --workers."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    proto.trainer_spec.ClearField("num_threads")
    return proto.SerializeToString()


def _user_error_of(e: RuntimeError, cfg: TokenizerConfig) -> Exception:
    msg = str(e)
    m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", msg)
    if m:
        return UserError(f"vocab_size={m.group(1)} is more than this text supports (at most "
                         f"{m.group(2)} pieces): use --set vocab_size={m.group(2)} or less, "
                         "or train on more text")
    m = re.search(r"required_chars\. (\d+) vs (\d+)", msg)
    if m:
        return UserError(f"vocab_size={m.group(1)} is too small for this text: it needs "
                         f"{m.group(2)}; use --set vocab_size={m.group(2)} or larger")
    return e


def tokenizer_config_json(cfg: TokenizerConfig, sp_model: bytes) -> dict:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=sp_model)
    special = {name: {"piece": p, "id": sp.piece_to_id(p)} for name, p in
               [("unk", UNK), ("bos", BOS), ("eos", EOS), ("pad", PAD)]
               + [(r, t) for r, t in ROLE_TOKENS.items()] + [("end_of_turn", END_OF_TURN)]
               + [(s, s) for s in cfg.extra_symbols]}
    return {
        "model_file": MODEL_FILE,
        "model_type": "sentencepiece-bpe",
        "vocab_size": sp.get_piece_size(),
        "special_tokens": special,
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK,
        "role_tokens": ROLE_TOKENS,
        "end_of_turn_token": END_OF_TURN,
        "chat_template": CHAT_TEMPLATE,
        "add_bos_token": True,
        "add_eos_token": False,
        "jieba": cfg.jieba,
        "byte_fallback": True,
        "normalization": "identity",
    }


# -- fertility ------------------------------------------------------------------------------

def fertility(tok: Tokenizer, docs: list[tuple[str, str]]) -> tuple[dict, int]:
    """Tokens per character and per word by language on (lang, text) pairs, and the number
    of documents whose round trip failed (always 0 unless something is broken)."""
    by_lang: dict[str, dict] = {}
    failures = 0
    texts = [t for _, t in docs]
    for (lang, text), ids in zip(docs, tok.encode_batch(texts)):
        if tok.decode(ids) != text:
            failures += 1
        s = by_lang.setdefault(lang, {"docs": 0, "chars": 0, "words": 0, "tokens": 0})
        s["docs"] += 1
        s["chars"] += len(text)
        s["words"] += count_words(text, lang)
        s["tokens"] += len(ids)
    for s in by_lang.values():
        s["tokens_per_char"] = round(s["tokens"] / max(s["chars"], 1), 4)
        s["tokens_per_word"] = round(s["tokens"] / max(s["words"], 1), 4)
    return dict(sorted(by_lang.items())), failures


# -- the stage ------------------------------------------------------------------------------

def _documents(datasets) -> Iterator[tuple[str, str, str | None]]:
    """(id, text, lang) of every row of the input datasets."""
    import pyarrow.parquet as pq

    for art in datasets:
        for f in dataset_files(art.path):
            names = pq.ParquetFile(f).schema_arrow.names
            if "text" not in names:
                raise UserError(f"{f} has no `text` column; the tokenizer trains on text")
            cols = ["text"] + [c for c in ("id", "lang") if c in names]
            for batch in pq.ParquetFile(f).iter_batches(batch_size=4096, columns=cols):
                d = batch.to_pydict()
                n = batch.num_rows
                ids = d.get("id") or [f"{f.name}:{i}" for i in range(n)]
                langs = d.get("lang") or [None] * n
                for i, t, lang in zip(ids, d["text"], langs):
                    if t:
                        yield str(i), t, lang
