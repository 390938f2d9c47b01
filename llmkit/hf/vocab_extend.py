"""`llmkit extend-vocab`: a model run whose byte-level BPE tokenizer (an imported Qwen, Llama 3,
SmolLM2) gets new pieces trained on one script's text (llmkit.hf.bpe_extend), and whose embedding
(and untied output head) grows by one row per new piece -> a checkpoint run with one complete step
folder, `step-00000000/`, as `llmkit import` writes, that every later stage reads.

A new row starts as the mean of the rows of the old pieces its text encoded to: the model reads the
new token as roughly what it read in its place before, and in a tied model its logit is the mean of
those pieces' logits, so text without the script keeps its loss and the script's text starts close
to it (LLaMA-Factory's `noisy_mean`, the mean of every row plus noise, is the alternative kept for
comparison). Documents held out of training (the rule `llmkit tokenizer` uses) measure tokens per
character before and after, check that every held-out text without the script keeps its ids, and
that every held-out text decodes back to itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from llmkit.checkpoints import step_folders as ckpt
from llmkit.checkpoints.step_folders import TOKENIZER
from llmkit.tokenizers.cjk import language_of
from llmkit.errors import ConfigError, UserError
from llmkit.hf.bpe_extend import (SCRIPTS, byte_level_problem, extended_tokenizer_json, has_script,
                                  script_words, train_extension)
from llmkit.hf.export import stored_dtype
from llmkit.hf.folder import write_json
from llmkit.tokenizers.tokenizer_json import HFTokenizer
from llmkit.checkpoints.loading import load_model, starting_weights
from llmkit.core.progress import print_summary
from llmkit.tokenizers.base import JSON_FILE, MODEL_FILE
from llmkit.data.tokenizer_training import _documents, _hash01, fertility
from llmkit.checkpoints.new_rows import write_extension

INITS = ("mean", "noisy_mean")
EMBEDDING, HEAD = "model.embed_tokens.weight", "lm_head.weight"


@dataclass
class ExtendVocabConfig:
    new_tokens: int = 8000  # pieces to add (fewer when fewer pairs occur min_frequency times)
    script: str = "han"  # han | kana | hangul: every new piece is a string of this script's characters only
    min_frequency: int = 2  # a pair of pieces seen fewer times in the training text is never joined
    init: str = "mean"  # new rows: mean (of the old pieces each replaces) | noisy_mean (LLaMA-Factory's)
    max_chars: int = 100_000_000  # train on at most this many characters of the script's documents
    heldout_fraction: float = 0.01  # documents kept out to measure (those `llmkit tokenizer` holds out)
    heldout_chars: int = 2_000_000  # at most this many held-out characters are measured
    seed: int = 0  # picks the held-out documents (and noisy_mean's noise)

    def __post_init__(self):
        if self.new_tokens < 1:
            raise ConfigError(f"extend-vocab new_tokens must be >= 1, got {self.new_tokens}")
        if self.script not in SCRIPTS:
            raise ConfigError(f"extend-vocab script must be one of {', '.join(SCRIPTS)}, got {self.script!r}")
        if self.min_frequency < 1:
            raise ConfigError(f"extend-vocab min_frequency must be >= 1, got {self.min_frequency}")
        if self.init not in INITS:
            raise ConfigError(f"extend-vocab init must be one of {', '.join(INITS)}, got {self.init!r}")
        if not 0.0 <= self.heldout_fraction < 0.5:
            raise ConfigError(f"extend-vocab heldout_fraction must be in [0, 0.5), got {self.heldout_fraction}")


def run_extend_vocab(ctx, cfg: ExtendVocabConfig, from_: str):
    """`llmkit extend-vocab --from MODEL --in CORPUS`: checkpoint run `ctx.out` (default "extended")."""

    art, step_dir = starting_weights(ctx.workspace, from_)
    datasets = ctx.input_list("dedup")
    original = extendable_tokenizer(step_dir / TOKENIZER)
    b = ctx.workspace.builder(ctx.out_name("extended"), stage="extend-vocab", config=cfg,
                              inputs=[art, *datasets], force=ctx.force)
    if b.up_to_date:
        return b
    train, heldout = split_corpus(datasets, cfg)
    words = script_words(original.backend, train, cfg.script)
    if not words:
        raise UserError(f"{', '.join(str(d.path) for d in datasets)}: no training document holds a {cfg.script} "
                        f"character; give a corpus in that script with --in, or set script= to the corpus's")
    extension = train_extension(original.backend, words, cfg.script, cfg.new_tokens, cfg.min_frequency)
    if not extension.tokens:
        raise UserError(f"0 new pieces: every {cfg.script} string seen {cfg.min_frequency}+ times in the corpus is "
                        f"already one piece of {step_dir / TOKENIZER} (or splits a character); the tokenizer needs "
                        "no extension for this text (lower min_frequency or give more text to find more)")
    with b:
        b.stats.update(write_extended_run(step_dir, original, extension, heldout, b.dir, cfg))
    s = b.stats
    print_summary(f"extend-vocab done: {b.final}", [
        ("new pieces", s["new_tokens"]), ("vocab", f"{s['vocab_before']} -> {s['vocab_after']}"),
        *[(f"{lang} tokens/char", f"{v['before']} -> {v['after']} ({v['fewer_pct']:.1f}% fewer)")
          for lang, v in s["tokens_per_char"].items()],
        ("held-out texts without the script, ids identical", f"{s['unchanged_docs']}/{s['docs_without_script']}"),
        ("round-trip failures", s["roundtrip_failures"]), ("seconds", round(time.time() - b.started, 1))])
    return b


def extendable_tokenizer(folder: Path):
    """The run's tokenizer, if llmkit can extend it (a byte-level BPE tokenizer.json); else a UserError."""

    if (folder / MODEL_FILE).is_file():
        raise UserError(f"{folder} is a sentencepiece tokenizer ({MODEL_FILE}); extend-vocab extends byte-level BPE "
                        f"tokenizers ({JSON_FILE} of Qwen, Llama 3, SmolLM2, GPT-2). For llmkit's own tokenizer, "
                        "train a larger one with `llmkit tokenizer` and pretrain with it")
    if not (folder / JSON_FILE).is_file():
        raise UserError(f"{folder} has no {JSON_FILE}; extend-vocab needs a model run that carries its tokenizer "
                        "(`llmkit import` writes one)")
    problem = byte_level_problem(json.loads((folder / JSON_FILE).read_text(encoding="utf-8")))
    if problem:
        raise UserError(f"{folder / JSON_FILE}: {problem}; extend-vocab extends byte-level BPE tokenizers only "
                        "(Qwen, Llama 3, SmolLM2, GPT-2)")
    return HFTokenizer(folder)


def split_corpus(datasets, cfg: ExtendVocabConfig) -> tuple[list[str], list[tuple[str, str]]]:
    """(training texts holding the script, at most max_chars in all; held-out (lang, text) pairs)."""

    train, heldout, train_chars, heldout_chars = [], [], 0, 0
    for doc_id, text, lang in _documents(datasets):
        if _hash01("heldout", cfg.seed, doc_id) < cfg.heldout_fraction:
            if heldout_chars < cfg.heldout_chars:
                heldout.append((lang or language_of(text), text))
                heldout_chars += len(text)
        elif train_chars < cfg.max_chars and has_script(text, cfg.script):
            train.append(text)
            train_chars += len(text)
    return train, heldout


def write_extended_run(step_dir: Path, original, extension, heldout, run_dir: Path, cfg: ExtendVocabConfig) -> dict:
    """`run_dir/step-00000000/` (tokenizer/, the grown weights, config.json, trainer_state.json,
    complete) and `run_dir/latest`; returns the manifest's counts."""

    out = Path(run_dir) / ckpt.step_dir_name(0)
    tokenizer_dir = out / ckpt.TOKENIZER
    original.save(tokenizer_dir)
    data, ids = extended_tokenizer_json(json.loads(original.backend.to_str()), extension)
    (tokenizer_dir / JSON_FILE).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    write_extension(tokenizer_dir, ids, script=cfg.script, vocab_before=original.vocab_size)  # for LoRA runs
    extended = HFTokenizer(tokenizer_dir)
    measured = compare_tokenizers(original, extended, heldout, cfg.script)
    parts = [[t.id for t in original.backend.model.tokenize(token)] for token in extension.tokens]
    vocab = write_grown_weights(step_dir, out, ids, parts, original.vocab_size, cfg)
    ckpt.mark_complete(out)
    return {"new_tokens": len(ids), "new_merges": len(extension.merges), "first_new_id": ids[0],
            "vocab_before": original.vocab_size, "vocab_after": extended.vocab_size, "model_vocab": vocab,
            "init": cfg.init, "script": cfg.script, **measured}


def compare_tokenizers(original, extended, heldout, script: str) -> dict:
    """Tokens per character by language before and after, held-out texts without the script whose
    ids stayed the same (all of them, or it is a bug), and round-trip failures (none, or a bug)."""

    before, _ = fertility(original, heldout)
    after, _ = fertility(extended, heldout)
    texts = [text for _, text in heldout]  # as `llmkit tokenize` reads them: a special token's string is text
    failures = sum(extended.decode(ids) != text for ids, text in zip(_documents_ids(extended, texts), texts))
    plain = [text for _, text in heldout if not has_script(text, script)]
    unchanged = sum(a == b for a, b in zip(original.encode_batch(plain), extended.encode_batch(plain)))
    if failures or unchanged != len(plain):  # never the input's fault
        raise AssertionError(f"extend-vocab: {failures} held-out texts do not round-trip, "
                             f"{len(plain) - unchanged} without {script} changed ids")
    per_char = {lang: {"before": before[lang]["tokens_per_char"], "after": after[lang]["tokens_per_char"],
                       "fewer_pct": round(100 * (1 - after[lang]["tokens"] / max(before[lang]["tokens"], 1)), 2)}
                for lang in after}
    return {"heldout_docs": len(heldout), "tokens_per_char": per_char, "docs_without_script": len(plain),
            "unchanged_docs": unchanged, "roundtrip_failures": failures}


def _documents_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    ids, counts = tokenizer.encode_flat(texts)
    ends = counts.cumsum()
    return [ids[end - n:end].tolist() for end, n in zip(ends, counts)]


def write_grown_weights(step_dir: Path, out: Path, ids: list[int], parts: list[list[int]], known_rows: int,
                        cfg: ExtendVocabConfig) -> int:
    """The source model (a LoRA run's adapters merged) with rows `ids` added to its embedding and
    untied head, written into step folder `out`; returns the new vocab_size."""
    import torch


    model, source = load_model(step_dir)
    tied = ckpt.tied_groups(model.state_dict(keep_vars=True))
    state = model.state_dict()
    vocab = max(model.config.vocab_size, ids[-1] + 1)
    generator = torch.Generator().manual_seed(cfg.seed)
    for name in (EMBEDDING, HEAD):
        if name not in tied:
            state[name] = grown_rows(state[name], ids, parts, vocab, known_rows, cfg.init, generator)
    for alias, kept in tied.items():
        state[alias] = state[kept]
    dtype = getattr(torch, stored_dtype(ckpt.weights_file(source)))
    state = {k: v.to(dtype) for k, v in state.items()}
    state.update({alias: state[kept] for alias, kept in tied.items()})
    config = dataclasses.replace(model.config, vocab_size=vocab)
    ckpt.save_weights(out / ckpt.WEIGHTS, state, tied)
    write_json(out / ckpt.MODEL_CONFIG, dataclasses.asdict(config))
    write_json(out / ckpt.TRAINER_STATE, {"step": 0, "tokens_seen": 0, "extended_from": str(source),
                                          "new_token_ids": [ids[0], ids[-1]]})
    return vocab


def grown_rows(matrix, ids: list[int], parts: list[list[int]], rows: int, known_rows: int, init: str, generator):
    """`matrix` with `rows` rows: its own, then row ids[i] set from the old rows parts[i] (mean), or
    from the mean of its first `known_rows` rows plus N(0, 1/d) noise (noisy_mean)."""
    import torch

    old = matrix.float()
    grown = torch.zeros(rows, old.shape[1])
    grown[:old.shape[0]] = old
    if init == "mean":
        new = torch.stack([old[p].mean(0) for p in parts])
    else:
        noise = torch.randn(len(ids), old.shape[1], generator=generator) / math.sqrt(old.shape[1])
        new = old[:known_rows].mean(0, keepdim=True) + noise
    grown[ids] = new
    return grown.to(matrix.dtype)
