"""A judging session: every model's reply to every prompt, generated ahead, and the items a rater
compares — one per prompt and pair of models, its left/right sides drawn once and stored.

The session is an artifact (`llmkit judge` makes it before serving, `--prepare` only that): `items.jsonl`
holds the items in the order raters see them; the server appends judgements to
`journal.jsonl` beside it (`llmkit.judge.journal`). Item ids are opaque hashes, so nothing a
page receives names a model.

Sessions and exports are both built by `llmkit judge`, so their manifests share the stage; an
export's manifest records the kind `EXPORT_KIND` (a session's kind is the stage's own), so the
workspace refuses either in place of the other without --force (llmkit.core.targets), and
`refuse_while_judged` refuses to replace a session while a server writes its journal.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from llmkit.core.config import config_to_dict
from llmkit.data.chat import prompt_messages
from llmkit.data.io import read_table
from llmkit.errors import ConfigError, UserError
from llmkit.generation import GenerateConfig, generate_texts, read_prompts, uses_chat_template, warn_if_empty
from llmkit.judge.journal import JOURNAL_FILE, describe_holder, read_journal, writer_of
from llmkit.judge.model_judge import ModelJudgeConfig
from llmkit.checkpoints.loading import load
from llmkit.core.workspace import MANIFEST, Artifact

ITEMS_FILE = "items.jsonl"
EXPORT_KIND = "judge-export"  # an export's manifest `kind`; a session's is its stage, `judge`


@dataclass
class ReplyConfig(GenerateConfig):
    greedy: bool = True  # the likeliest reply, as exact match scores a model; false: sampled (temperature, top_k, top_p)


@dataclass
class JudgeConfig:
    seed: int = 0  # draws each item's left/right sides and the order raters see the items in
    max_prompts: int = 0  # judge the first N prompts only; 0 = all of them
    resamples: int = 1000  # bootstrap resamples behind the export's confidence intervals
    generation: ReplyConfig = field(default_factory=ReplyConfig)  # how replies are generated: max_new_tokens, greedy…
    raters: str = ""  # the export keeps these raters' judgements only (comma-separated, e.g. checker or model:smollm2); "" = all
    model_judge: ModelJudgeConfig = field(default_factory=ModelJudgeConfig)  # how `--model RUN` judges: combine, ties, language…

    def __post_init__(self):
        if self.max_prompts < 0 or self.resamples < 0:
            raise ConfigError(f"max_prompts and resamples must be >= 0, got {self.max_prompts}, {self.resamples}")


def session_settings(cfg: JudgeConfig, models: list[str], prompts: str) -> dict:
    """What decides the replies and items (the session's config and fingerprint): not the
    export's resamples, so exporting differently never invalidates a session's judgements."""
    return {"models": models, "prompts": prompts, "seed": cfg.seed, "max_prompts": cfg.max_prompts,
            "generation": config_to_dict(cfg.generation)}


# -- prompts ---------------------------------------------------------------------------------

def load_prompts(ctx, prompts: str) -> tuple[list[tuple[str, object]], Artifact | None, str | None]:
    """((id, prompt) pairs, the prompt artifact or None, the file's content hash or None): a
    prompt dataset of the workspace (`prompt` or `messages` column), or a file `llmkit generate`
    reads (.jsonl with `prompt`/`messages`, else one prompt a line). A chat prompt is a list of
    messages."""
    path = Path(prompts)
    if path.is_file():
        texts = read_prompts(path)
        return [(f"line-{n}", p) for n, p in enumerate(texts, 1)], None, \
            hashlib.sha256(path.read_bytes()).hexdigest()
    artifact = ctx.workspace.artifact(prompts)
    rows = read_table(artifact.path).to_pylist()
    if rows and "prompt" not in rows[0] and "messages" not in rows[0]:
        raise UserError(f"--prompts {prompts}: {artifact.path} has no `prompt` or `messages` column; "
                        "ingest prompts with `llmkit ingest --kind prompt`")
    return [(str(r.get("id") or n), prompt_messages(r) if r.get("messages") else r["prompt"])
            for n, r in enumerate(rows)], artifact, None


# -- items -----------------------------------------------------------------------------------

def pair_items(prompts: list[tuple[str, object]], replies: dict[str, list[str]], seed: int) -> list[dict]:
    """One item per prompt and pair of models, its sides drawn from its own id (a fair coin per
    item), all items in one order shuffled by `seed`."""
    items = []
    for n, (prompt_id, prompt) in enumerate(prompts):
        for a, b in combinations(replies, 2):
            item_id = hashlib.blake2b(f"{seed}\0{n}\0{prompt_id}\0{a}\0{b}".encode(), digest_size=8).hexdigest()
            left, right = (a, b) if random.Random(item_id).random() < 0.5 else (b, a)
            items.append({"id": item_id, "prompt_id": prompt_id, "prompt": prompt, "left_model": left,
                          "right_model": right, "left": replies[left][n], "right": replies[right][n]})
    random.Random(seed).shuffle(items)
    return items


def write_items(directory: Path, items: list[dict]) -> None:
    with open(Path(directory) / ITEMS_FILE, "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")


def read_items(session: Path) -> list[dict]:
    path = Path(session) / ITEMS_FILE
    if not path.is_file():
        raise UserError(f"{session} is not a judging session (no {ITEMS_FILE}); make one with "
                        "`llmkit judge --prepare --from A,B --prompts P --out NAME`")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# -- replies ---------------------------------------------------------------------------------

def generate_replies(ctx, cfg: ReplyConfig, model: str, prompts: list) -> list[str]:
    import torch

    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    net, tokenizer = load(model, device=device, workspace=ctx.workspace.root)
    print(f"judge: {model} replies to {len(prompts)} prompts", file=sys.stderr)
    records = generate_texts(net, tokenizer, prompts, cfg)
    warn_if_empty(records, uses_chat_template(net, cfg) or any(not isinstance(p, str) for p in prompts))
    return [r["completion"] for r in records]


def parse_models(models: str | None) -> list[str]:
    names = [m.strip() for m in (models or "").split(",") if m.strip()]
    if len(names) < 2 or len(set(names)) < len(names):
        raise UserError(f"--from needs two or more different checkpoint runs, comma-separated "
                        f"(e.g. --from sft,dpo,ppo); got {models!r}")
    return names


def prepare_session(ctx, cfg: JudgeConfig, models: str | None, prompts: str | None) -> Artifact:
    """The session artifact `--out` (default `judge`): replies generated and paired, or the
    existing one when it is up to date."""
    names = parse_models(models)
    if not prompts:
        raise UserError("--prompts is required: a prompt dataset (e.g. prompts_eval) or a file")
    runs = [ctx.workspace.artifact(m) for m in names]
    rows, prompt_art, file_hash = load_prompts(ctx, prompts)
    rows = rows[:cfg.max_prompts or None]
    if not rows:
        raise UserError(f"--prompts {prompts} holds no prompts")
    settings = {**session_settings(cfg, names, prompts), "prompts_sha256": file_hash}
    out = ctx.out_name("judge")
    inputs = runs if prompt_art is None else [*runs, prompt_art]
    # a generation setting a later llmkit adds, at its default, leaves the session (and its judgements) as it is
    b = ctx.workspace.builder(out, stage="judge", config=settings, inputs=inputs, force=ctx.force,
                              defaults={"generation": config_to_dict(ReplyConfig())})
    if not b.up_to_date:
        refuse_while_judged(b.final)
        refuse_to_drop_judgements(b.final, out, ctx.force)
        with b:
            replies = {m: generate_replies(ctx, cfg.generation, m, [p for _, p in rows]) for m in names}
            items = pair_items(rows, replies, cfg.seed)
            write_items(b.dir, items)
            b.stats = {"models": len(names), "prompts": len(rows), "items": len(items)}
    return Artifact.open(b.final, ctx.workspace.root)


def refuse_to_drop_judgements(session: Path, name: str, force: bool) -> None:
    """Rebuilding a session replaces its items, and its journal with them: never without --force."""
    judged = len(read_journal(session / JOURNAL_FILE))
    if judged and not force:
        raise UserError(f"{session} holds {judged} judgements of other replies (the models, prompts or "
                        f"settings changed). Export them first (`llmkit judge --export --in {name} --out "
                        f"NEW_NAME`), then use another --out, or add --force to discard them")


def refuse_while_judged(path: Path) -> None:
    """Even with --force, never replace a session a server is writing judgements into: they
    would go to a deleted journal."""
    holder = writer_of(Path(path) / JOURNAL_FILE)
    if holder is not None:
        raise UserError(f"{path} is being judged now: {describe_holder(holder)} serves it. Stop that "
                        "server first, or write elsewhere with --out NEW_NAME")


def unmarked_export(path: Path) -> bool:
    """An export of an llmkit that recorded no kind: stage `judge`, no kind, no items."""
    try:
        manifest = json.loads((Path(path) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(manifest, dict) and manifest.get("stage") == "judge" and "kind" not in manifest
            and not (Path(path) / ITEMS_FILE).exists())
