"""`llmkit tokenizer` as a data stage: one phase of one sealed task (llmkit.data.driver) that
samples the input's sentences, trains the sentencepiece model on `--workers` threads and
measures fertility on held-out documents (llmkit.data.tokenizer_training); the assembly links its
files into the `tokenizer` artifact.

One task, not a task per input part: the training sample is the whole input's (its `k`
sentences of smallest hash) and the held-out documents are the first ones drawn up to
`heldout_chars`, in input order. A sample per part would keep up to `k` sentences per part on
disk, and training needs them all in one process anyway.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from llmkit.tokenizers.cjk import language_of
from llmkit.data.driver import Assembled, DataStage, Phase, SealedTasks, run_data_stage
from llmkit.core.progress import Progress, print_summary
from llmkit.tokenizers.sentencepiece import CONFIG_FILE, MODEL_FILE, Tokenizer
from llmkit.data.tokenizer_training import (TokenizerConfig, TrainingSample, _documents, _hash01,
                                       fertility, tokenizer_config_json, train_sentencepiece)
from llmkit.core.durable import link_or_copy, write_atomic

FILES = (MODEL_FILE, CONFIG_FILE)
TASK_KEYS = ("seconds", "files")  # what the driver adds to a task's record: not the stage's stats


@dataclass(frozen=True)
class TokenizerTask(SealedTasks):
    """Task 0 writes `root/part-00000/` (tokenizer.model, tokenizer_config.json); its marker
    holds the stage's stats."""
    root: Path
    datasets: list  # the input artifacts
    cfg: TokenizerConfig
    threads: int    # sentencepiece's (the model file is the same at any count)

    def __len__(self) -> int:
        return 1

    def build(self, k: int, tmp: Path) -> dict:
        cfg = self.cfg
        sample = TrainingSample(cfg.input_sentence_size, cfg.seed)
        heldout: list[tuple[str, str]] = []
        heldout_chars = docs = 0
        with Progress("tokenizer: sampling", unit="docs") as bar:
            for doc_id, text, lang in _documents(self.datasets):
                docs += 1
                bar.advance(1)
                if _hash01("heldout", cfg.seed, doc_id) < cfg.heldout_fraction:
                    if heldout_chars < cfg.heldout_chars:
                        heldout.append((lang or language_of(text), text))
                        heldout_chars += len(text)
                    continue
                sample.add(doc_id, text, cfg.max_sentence_chars)
        sentences = sample.sentences()
        started = time.time()
        model, plan = train_sentencepiece(sentences, cfg, self.threads)
        train_seconds = time.time() - started
        (tmp / MODEL_FILE).write_bytes(model)
        write_atomic(tmp / CONFIG_FILE, json.dumps(tokenizer_config_json(cfg, model),
                                                   indent=2, ensure_ascii=False))
        tok = Tokenizer(tmp)
        fert, failures = fertility(tok, heldout)
        if failures:  # a bug, never a user error
            raise AssertionError(f"tokenizer: {failures} held-out documents do not round-trip")
        no_fertility = None if fert else _why_no_heldout(cfg, docs)
        if no_fertility:
            print(f"warning: tokenizer: no fertility measured: {no_fertility}", flush=True)
        return dict(
            vocab_size=tok.vocab_size, docs=docs, sample_sentences=len(sentences),
            sample_chars=sum(map(len, sentences)), sentences_seen=sample.sentences_seen,
            character_coverage=plan.requested, character_coverage_used=round(plan.used, 6),
            coverage_lowered=plan.lowered, required_chars=plan.required_chars,
            byte_fallback_chars=plan.byte_chars, jieba=cfg.jieba,
            heldout_docs=len(heldout), fertility=fert, no_fertility=no_fertility,
            roundtrip_failures=failures,
            train_seconds=round(train_seconds, 2), train_threads=self.threads)


def _why_no_heldout(cfg: TokenizerConfig, docs: int) -> str:
    """Why the fertility table is empty, and what to set instead."""
    if cfg.heldout_fraction == 0:
        return "heldout_fraction=0 holds no document out of training; set it to e.g. 0.01"
    if cfg.heldout_chars <= 0:
        return f"heldout_chars={cfg.heldout_chars} measures no held-out text; set it above 0"
    return (f"none of the {docs} documents was drawn as held-out text (heldout_fraction="
            f"{cfg.heldout_fraction:g} draws about {docs * cfg.heldout_fraction:.1f}); raise "
            "heldout_fraction or add documents")


def run_tokenizer(ctx, cfg: TokenizerConfig):
    """`llmkit tokenizer`: train on the input dataset(s) and write the tokenizer artifact."""
    datasets = ctx.input_list("dedup")
    return run_data_stage(ctx, DataStage(
        "tokenizer", cfg, datasets, "tokenizer",
        [Phase("train", 1, lambda work: TokenizerTask(
            work.dir / "train", datasets, cfg, work.within_task))],
        assemble, source=", ".join(str(a.path) for a in datasets),
        refuse_empty=lambda stats: None,  # the task refuses an input without text itself
        summary=print_tokenizer_summary))


def assemble(out_dir: Path, done: dict) -> Assembled:
    task = done["train"]
    for name in FILES:
        link_or_copy(task.folder(0) / name, Path(out_dir) / name)
    return Assembled({k: v for k, v in task.info(0).items() if k not in TASK_KEYS})


def print_tokenizer_summary(b) -> None:
    stats = b.stats
    rows = [("vocab size", stats["vocab_size"]), ("sample sentences", stats["sample_sentences"]),
            ("coverage used", f"{stats['character_coverage_used']:.6g}")]
    rows += [(f"{lang} tokens/char", s["tokens_per_char"]) for lang, s in stats["fertility"].items()]
    rows.append(("seconds", round(time.time() - b.started, 2)))
    print_summary(f"{b.name} done", rows)
