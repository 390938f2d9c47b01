"""The general-ability gate: a run names held-out general evaluations
(`--set gate.files=FILE[,FILE] --set gate.tolerance=0.05`); its start and the trained model are
scored on each file, the manifest records both (`gate`), and a run that fell more than the
tolerance below its start on any file fails the stage (exit 2, saying by how much) unless
`gate.action=warn`. `llmkit status` and `report` show such a run.

A file is scored as `llmkit eval` scores it: rows with `choices` (or `A`, `B`, … fields) are
multiple-choice questions (log-likelihood accuracy, `eval.choice`), other rows greedy replies
against their `references` / `answer` (`contains` by default, or `exact_match`;
`eval.generation`). The gate says how a run is checked, not what it computes: changing it never
retrains (it is not in the run's fingerprint), and a finished run given a new gate is scored
again and its manifest updated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from llmkit.errors import ConfigError, UserError
from llmkit.data.input_files import eval_input, input_name, parse_questions, read_rows
from llmkit.eval.generation import contains_rate, exact_match_rate, prompt_ids, references_of
from llmkit.checkpoints.loading import load_model, load_tokenizer
from llmkit.checkpoints.step_folders import checkpoint_step_dir
from llmkit.core.durable import write_atomic
from llmkit.core.locks import acquire_lock, release_lock
from llmkit.core.workspace import MANIFEST
from llmkit.checkpoints.lora import PINNED_BASE
from llmkit.eval.choice import ChoiceConfig, evaluate_choice
from llmkit.model.lm_scoring import LMScorer

GATE = "gate"  # the manifest's entry
GATE_STAGES = ("sft", "dpo", "kto", "distill", "pretrain")  # stages whose output is a language model


@dataclass
class GateConfig:
    files: list[str] = field(default_factory=list)  # held-out general eval files (jsonl/json/parquet) or datasets; [] = no gate
    tolerance: float = 0.05  # the run may score at most this much below its start on each file
    action: Literal["fail", "warn"] = "fail"  # fail: the stage exits 2 when the run falls below; warn: it says so and goes on
    metric: Literal["contains", "exact_match"] = "contains"  # what scores a reply of a generation file
    max_new_tokens: int = 32  # reply length limit of the generation files
    prompt_format: Literal["auto", "chat", "plain"] = "auto"  # auto: chat where the tokenizer has a template

    def __post_init__(self):
        if not 0 <= self.tolerance < 1:
            raise ConfigError(f"gate.tolerance must be in [0, 1), got {self.tolerance}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"gate.max_new_tokens must be >= 1, got {self.max_new_tokens}")


class GateFailed(UserError):
    """The run fell below its gate (the manifest is written; the stage exits 2)."""


def gate_inputs(ctx, stage: str, cfg) -> list:
    """The gate's files as artifacts, each checked to exist and to hold scorable rows, before
    anything is written; [] without a gate."""

    files = cfg.gate.files
    if not files:
        return []
    if stage not in GATE_STAGES:
        raise ConfigError(f"gate.files: `llmkit {stage}` does not write a language model to score; "
                          f"the gate is a setting of {', '.join(GATE_STAGES)}")
    arts = []
    for spec in files:
        if not Path(spec).is_file() and not (ctx.workspace.root / spec).exists() and (
                Path(spec).suffix or "/" in spec):
            raise UserError(f"gate.files: {spec}: no such file (from {Path.cwd()}), nor an artifact "
                            f"of that name in workspace {ctx.workspace.root}")
        art = eval_input(ctx.workspace, spec)
        rows = read_rows(art, 1)
        if not rows or not (rows[0].get("prompt") or rows[0].get("messages") or rows[0].get("question")):
            raise UserError(f"gate.files: {spec}: no rows with a `prompt`, `messages` or `question`")
        arts.append(art)
    return arts


# -- scoring -----------------------------------------------------------------------------------

def is_choice_file(rows: list[dict]) -> bool:
    return bool(rows) and ("choices" in rows[0] or "A" in rows[0])


def gate_scores(model, tokenizer, arts: list, cfg, device) -> dict:
    """{file name: {"metric", "score", "rows"}} of `model` on the gate's files."""

    gc, out = cfg.gate, {}
    chat = gc.prompt_format == "chat" or (gc.prompt_format == "auto"
                                          and getattr(tokenizer, "chat_template", None) is not None)
    was_training = model.training
    try:
        for art in arts:
            name, rows = input_name(art), read_rows(art)
            if is_choice_file(rows):
                scorer = LMScorer(model.to(device).eval(), device=device)
                r = evaluate_choice(scorer, tokenizer, parse_questions(rows, name), ChoiceConfig())
                out[name] = {"metric": "acc", "score": round(r["acc"], 4), "rows": r["questions"]}
                continue
            out[name] = {"metric": gc.metric, "score": round(reply_score(model, tokenizer, rows, name, gc, chat,
                                                                          device), 4), "rows": len(rows)}
            continue
    finally:
        model.train(was_training)
    return out


def reply_score(model, tokenizer, rows: list[dict], name: str, gc: GateConfig, chat: bool, device) -> float:
    """`contains` or `exact_match` of greedy replies, as `eval.generation` scores them (its
    BLEU/ROUGE, which the gate does not read, are not computed)."""
    from llmkit.model.decoding import generate_replies, reply_text

    refs = [references_of(r, f"{name} row {i + 1}") for i, r in enumerate(rows)]
    prompts = [prompt_ids(tokenizer, r, chat, f"{name} row {i + 1}") for i, r in enumerate(rows)]
    stop_ids = [tokenizer.end_of_turn_id, tokenizer.eos_id] if chat else [tokenizer.eos_id]
    replies = generate_replies(model.to(device).eval(), prompts, stop_ids=stop_ids, pad_id=tokenizer.pad_id,
                               max_new_tokens=gc.max_new_tokens, batch_size=16)
    texts = [reply_text(tokenizer, r, cut=len(r) == gc.max_new_tokens) for r in replies]
    if not chat:  # a plain prompt's reply ends at its first newline, as eval's stop_at_newline
        texts = [t.strip("\n").split("\n", 1)[0] for t in texts]
    texts = [t.strip() for t in texts]
    return (contains_rate if gc.metric == "contains" else exact_match_rate)(texts, refs)


def gate_record(base: dict, run: dict, cfg) -> dict:
    """What the manifest records: both scores of each file, the drop, and whether the run passed."""
    gc = cfg.gate
    files = {name: {"metric": b["metric"], "rows": b["rows"], "base": b["score"],
                    "run": run[name]["score"], "drop": round(b["score"] - run[name]["score"], 4)}
             for name, b in base.items()}
    failed = [n for n, f in files.items() if f["drop"] > gc.tolerance + 1e-9]
    return {"files": files, "tolerance": gc.tolerance, "action": gc.action, "metric": gc.metric,
            "max_new_tokens": gc.max_new_tokens, "passed": not failed, "failed": failed}


def gate_lines(record: dict | None) -> list[tuple]:
    """Summary lines: each file's base -> run score."""
    return [] if not record else [(f"gate {name}", f"{f['metric']} {f['base']:.3f} -> {f['run']:.3f} "
                             f"(drop {f['drop']:+.3f}, tolerance {record['tolerance']})")
            for name, f in record["files"].items()]


def gate_message(run_name: str, record: dict) -> str:
    """Why the run failed its gate, by how much."""
    parts = [f"{name}: {f['metric']} {f['base']:.3f} -> {f['run']:.3f}, {f['drop']:.3f} below its "
             f"start ({f['drop'] - record['tolerance']:.3f} past the tolerance {record['tolerance']})"
             for name, f in record["files"].items() if name in record["failed"]]
    return (f"gate: {run_name} fell below the general-ability gate — " + "; ".join(parts)
            + ". Add replay (--set replay.prompts=DATASET) or raise replay.ratio, train less, or set gate.action=warn")


def check_gate(run_name: str, record: dict | None) -> None:
    """Raise GateFailed for a failed gate whose action is fail; print a warning for warn."""
    import sys

    if not record or record["passed"]:
        return
    if record["action"] == "fail":
        raise GateFailed(gate_message(run_name, record))
    print(f"warning: {gate_message(run_name, record)}", file=sys.stderr)


def same_gate(record: dict | None, cfg, arts: list) -> bool:
    """Whether the manifest's gate record answers this gate (same files, fingerprints, settings)."""
    gc = cfg.gate
    return bool(record) and record.get("fingerprints") == [a.fingerprint for a in arts] and all(
        record.get(k) == getattr(gc, k) for k in ("tolerance", "action", "metric", "max_new_tokens"))


# -- a finished run given a gate -------------------------------------------------------------

def gate_finished_run(ctx, b, cfg, arts: list, start_step: Path | None) -> dict | None:
    """The gate of an up-to-date run: its recorded one when it answers this gate, else the
    start and the run's latest checkpoint scored now and the manifest rewritten (atomically,
    under the artifact's lock)."""

    path = b.final / MANIFEST
    manifest = json.loads(path.read_text())
    if not arts or same_gate(manifest.get(GATE), cfg, arts):
        return manifest.get(GATE) if arts else None
    if start_step is None:
        raise ConfigError(f"gate.files: {b.name} has no start checkpoint to compare with (pretrain --from)")
    run_step = checkpoint_step_dir(b.final)
    tokenizer = load_tokenizer(run_step)
    base = gate_scores(load_model(start_step)[0], tokenizer, arts, cfg, "cpu")
    run = gate_scores(load_model(run_step)[0], tokenizer, arts, cfg, "cpu")
    record = {**gate_record(base, run, cfg), "start": str(start_step),
              "fingerprints": [a.fingerprint for a in arts]}
    lock = acquire_lock(b.final.with_name(b.final.name + ".lock"))
    try:
        manifest[GATE] = record
        write_atomic(path, json.dumps(manifest, indent=2, ensure_ascii=False, default=str))
    finally:
        release_lock(lock)
    for label, value in gate_lines(record):
        print(f"  {label:<24} {value}")
    return record


def start_of(ctx, b, inputs: list) -> Path | None:
    """The checkpoint a finished run started from: its pinned LoRA base, the `from` its manifest
    names (pretrain), else the latest checkpoint of its first input."""

    manifest = json.loads((b.final / "manifest.json").read_text())
    if (b.final / PINNED_BASE).exists():
        return (b.final / PINNED_BASE).resolve()
    if manifest.get("from"):
        return Path(manifest["from"])
    first = next((a for a in inputs if a is not None), None)
    try:
        return checkpoint_step_dir(first.path) if first is not None else None
    except UserError:
        return None
