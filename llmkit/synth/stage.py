"""`llmkit synth`: data made by a model, through the data driver.

The candidates (instructions to sample, or the input dataset's rows) are cut into tasks of
`rows_per_task`; task k generates its rows with its own seed (`task_seed`) and the driver seals
it, so a killed run resumes at the first unsealed task and gives the bytes an uninterrupted run
gives, a second run is up to date, and --rank/--world-size or --workers split the tasks.
The artifact is an ordinary dataset of the kind's schema (llmkit.synth.kinds), its manifest's
`synth` stats the provenance: the model (or server), the chat template, the prompt templates,
the sampling settings and the seed.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from llmkit.core.progress import data_stage_summary
from llmkit.data.driver import Assembled, DataStage, Phase, SealedTasks, run_data_stage
from llmkit.data.input_files import resolve_checkpoint
from llmkit.data.io import dataset_files, open_parquet, part_rows
from llmkit.data.pipeline import RowCounts, SplitWriter, link_task_outputs
from llmkit.errors import UserError
from llmkit.synth import kinds
from llmkit.synth.config import KINDS, SynthConfig
from llmkit.synth.judges import Models, grounding_judge, open_generator, pair_judge
from llmkit.synth.prompts import GROUNDING, QA, REPHRASE

NEEDS = {"prompts": ({"prompt", "messages"}, "a prompt or sft dataset (`llmkit ingest --kind prompt`)"),
         "documents": ({"text"}, "a text dataset (`llmkit ingest`)")}


def run_synth(ctx, cfg: SynthConfig, from_: str | None = None):
    """Run (or resume) `llmkit synth`; its Builder, or None for a --rank run."""
    plan = plan_synth(ctx, cfg, from_)
    return run_data_stage(ctx, DataStage(
        "synth", cfg, plan.inputs, f"synth_{cfg.kind}",
        [Phase("generate", len(plan.slices), lambda work: SynthTasks(work.dir / "generate", plan))],
        lambda out, done: assemble(out, done["generate"], plan), source=plan.data or plan.source,
        unit="rows" if cfg.reads else "instructions", summary=lambda b: summary(b, cfg)))


@dataclass(frozen=True)
class Plan:
    cfg: SynthConfig
    models: Models
    inputs: list  # the artifacts read: model, dataset, judge (fingerprinted)
    data: str | None  # the input dataset's folder
    slices: list  # (first, stop) of each task: input rows, or instructions
    source: str  # what the rows' `source` says, and the empty-output refusal names


def plan_synth(ctx, cfg: SynthConfig, from_: str | None) -> Plan:
    """The run's inputs and tasks, every mistake in the command refused first (exit 2)."""
    if cfg.kind is None:
        raise UserError(f"synth needs --kind: one of {', '.join(KINDS)}")
    if from_ is None and not cfg.server.url:
        raise UserError("synth needs --from MODEL (a run or an imported model), or an "
                        "OpenAI-compatible server: --set server.url=http://HOST:PORT")
    if cfg.kind == "pairs" and cfg.temperature == 0:
        raise UserError("synth --kind pairs samples two replies per prompt: temperature=0 makes them "
                        "the same; set temperature > 0 (e.g. --set temperature=0.8)")
    inputs, model = [], None
    if from_ is not None:
        run, step = resolve_checkpoint(ctx.workspace, from_)
        inputs, model = [run], str(run.path / step)
    judge, judge_is_rm = None, False
    if cfg.judge:
        run, step = resolve_checkpoint(ctx.workspace, cfg.judge)
        inputs.append(run)
        judge, judge_is_rm = str(run.path / step), run.stage == "rm"
    if cfg.kind == "pairs" and judge is None and cfg.server.url:
        raise UserError("synth --kind pairs against a server needs --set judge=RUN (an rm run, or "
                        "a local model that compares the replies)")
    if cfg.kind == "qa" and cfg.grounding == "likelihood" and judge is None and cfg.server.url:
        raise UserError("synth --kind qa with grounding=likelihood reads a model's log-likelihoods, which "
                        "a server does not give: --set judge=RUN (a local model) or grounding=ask")
    models = Models(model, judge, judge_is_rm, cfg.server, cfg.server.model or from_ or "default",
                    cfg.device, cfg.batch_size, cfg.judge_combine, cfg.decode.weights)
    name = Path(from_).name if from_ else models.server_model
    if not cfg.reads:
        if ctx.inputs:
            raise UserError(f"synth --kind {cfg.kind} reads no dataset (got --in {' '.join(ctx.inputs)}); "
                            "say how many rows with --set rows=N")
        return Plan(cfg, models, inputs, None, _cut(cfg.rows, cfg.rows_per_task), f"synth:{name}")
    if not ctx.inputs:
        raise UserError(f"synth --kind {cfg.kind} reads {NEEDS[cfg.reads][1]}: give --in NAME_OR_PATH")
    data = ctx.input("")
    _check_columns(data.path, cfg)
    rows = sum(map(part_rows, dataset_files(data.path)))
    return Plan(cfg, models, [*inputs, data], str(data.path), _cut(rows, cfg.rows_per_task),
                f"synth:{name}")


def _check_columns(path: Path, cfg: SynthConfig) -> None:
    import pyarrow.parquet as pq

    files = dataset_files(path)
    need, what = NEEDS[cfg.reads]
    have = set(pq.read_schema(files[0]).names) if files else set()
    if files and not need & have:
        raise UserError(f"synth --kind {cfg.kind} reads {what}; {path} has columns "
                        f"{', '.join(sorted(have))} but none of {', '.join(sorted(need))}")


def _cut(n: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def task_seed(seed: int, k: int) -> int:
    """Task k's sampling seed: its own stream, whichever tasks ran before it in this process."""
    return int.from_bytes(hashlib.sha256(f"synth:{seed}:{k}".encode()).digest()[:7], "big")


class SynthTasks(SealedTasks):
    def __init__(self, root: Path, plan: Plan):
        self.root, self.plan = root, plan

    def __len__(self) -> int:
        return len(self.plan.slices)

    def build(self, k: int, tmp: Path) -> dict:
        plan, cfg = self.plan, self.plan.cfg
        first, stop = plan.slices[k]
        gen = open_generator(plan.models)
        before, started = gen.tokens, time.time()
        seed = task_seed(cfg.seed, k)
        if cfg.kind == "instructions":
            kept, removed = kinds.instructions(first, stop - first, gen, cfg, seed, plan.source)
        else:
            rows = read_slice(Path(plan.data), first, stop)
            if cfg.kind == "qa":
                kept, removed = kinds.qa(rows, gen, grounding_judge(plan.models, gen), cfg, seed, plan.source)
            elif cfg.kind == "pairs":
                kept, removed = kinds.pairs(rows, gen, pair_judge(plan.models, gen), cfg, seed, plan.source)
            else:
                kept, removed = getattr(kinds, cfg.kind)(rows, gen, cfg, seed, plan.source)
        writer = SplitWriter.task_layout(tmp)
        writer.write(_table(kept), _table(removed), Counter(r["reason"] for r in removed))
        counts = writer.close(len(kept) + len(removed), "synth")
        return {**counts.as_json(), "rows_read": stop - first, "tokens": gen.tokens - before,
                "generate_seconds": round(time.time() - started, 3), "template": template_of(gen, cfg)}


def _table(rows: list[dict]):
    import pyarrow as pa

    keys = list(dict.fromkeys(k for r in rows for k in r))
    return pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows])


def read_slice(path: Path, first: int, stop: int) -> list[dict]:
    """Rows first … stop - 1 of the dataset at `path`, as dicts."""
    out, at = [], 0
    for part in dataset_files(path):
        n = part_rows(part)
        if at + n > first and at < stop:
            table = open_parquet(part).read()
            out += table.slice(max(first - at, 0), min(stop, at + n) - max(first, at)).to_pylist()
        at += n
    return out


def template_of(gen, cfg: SynthConfig) -> str | None:
    """The chat template the prompts went through (Magpie: the user-turn prefix it starts from);
    None for a server, whose template is its own."""
    tokenizer = getattr(gen, "tokenizer", None)
    if tokenizer is None:
        return None
    if cfg.kind == "instructions":
        return gen.user_turn_prefix().text
    return tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None


def prompt_templates(cfg: SynthConfig) -> dict:
    if cfg.kind == "qa":
        return {"qa": QA, "grounding": GROUNDING}
    if cfg.kind == "rephrase":
        return {style: REPHRASE[style] for style in cfg.styles}
    return {}  # the prompts are the input's (answers, pairs) or none (instructions)


def assemble(out_dir: Path, tasks: SynthTasks, plan: Plan) -> Assembled:
    infos = [tasks.info(k) for k in range(len(tasks))]
    link_task_outputs([tasks.folder(k) for k in range(len(tasks))], out_dir, "synth")
    counts = sum((RowCounts.from_json(i) for i in infos), RowCounts())
    counts.check("synth")
    cfg, models = plan.cfg, plan.models
    tokens, seconds = sum(i["tokens"] for i in infos), sum(i["generate_seconds"] for i in infos)
    provenance = {
        "kind": cfg.kind, "writes": cfg.writes, "model": models.model or cfg.server.url,
        "server_model": models.server_model if cfg.server.url else None, "judge": models.judge,
        "template": infos[0]["template"] if infos else None, "prompts": prompt_templates(cfg),
        "sampling": {"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
                     "max_new_tokens": cfg.max_new_tokens, "n": 2 if cfg.kind == "pairs" else cfg.n},
        "seed": cfg.seed}
    return Assembled({**counts.stats(), "rows_read": sum(i["rows_read"] for i in infos),
                      "tokens_generated": tokens, "generate_seconds": round(seconds, 3),
                      "tokens_per_second": round(tokens / seconds, 1) if seconds else None,
                      "synth": provenance}, counts.first_removed)


def summary(builder, cfg: SynthConfig) -> None:
    s = builder.stats
    data_stage_summary(builder.name, s, time.time() - builder.started, notes=[
        (f"kept ({cfg.writes} rows)", f"{s['rows_out'] / max(s['rows_in'], 1):.1%}"),
        ("tokens generated", s["tokens_generated"]), ("tokens/s", s["tokens_per_second"])])
