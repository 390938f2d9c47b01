"""The start model's replies to `replay.prompts`, the post-training replay rows (`llmkit.train.replay`).

The replies are a workspace artifact, `replay-<model>` (manifest: the model's step folder and
fingerprint, the prompts' fingerprint, the sampling settings). Each reply is keyed by its prompt:
a changed prompt file regenerates only the replies of prompts it did not have, a second run
generates nothing, and a run killed mid-way keeps the batches it finished (the builder's work
folder) and goes on from there.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from llmkit.checkpoints.loading import load, load_tokenizer, starting_weights
from llmkit.checkpoints.lora_files import PINNED_BASE, weights_fingerprint
from llmkit.core.targets import MANIFEST
from llmkit.core.workspace import Artifact
from llmkit.data.chat import prompt_messages
from llmkit.data.input_files import read_rows
from llmkit.errors import UserError

REPLIES = "replies.jsonl"
DONE = "done.jsonl"  # in the builder's work folder: the replies generated so far (resume)


def prompt_key(messages: list[dict]) -> str:
    return hashlib.blake2b(json.dumps(messages, ensure_ascii=False, sort_keys=True).encode(),
                           digest_size=12).hexdigest()


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # the line a kill cut short: generated again
            pass
    return out


def _model_artifact(step_dir: Path):
    run = next((d for d in (step_dir, step_dir.parent) if (d / MANIFEST).is_file()), None)
    if run is None:
        raise UserError(f"{step_dir}: no manifest beside the checkpoint; replay needs a model run")
    return Artifact.open(run)


def replay_replies(ctx, cfg, prompts_art, start_step: Path, model=None) -> tuple[list[dict], dict]:
    """(SFT rows: each prompt with the replay model's reply, provenance): the artifact
    `replay-<model>` built or reused. `model` is the loaded start (used when replay.model is not
    set, so it is not loaded twice)."""

    rc = cfg.replay
    model_art, step = starting_weights(ctx.workspace, rc.model) if rc.model else (
        _model_artifact(start_step), start_step)
    # the weights, not their path: a LoRA run continued on its pinned copy of the base reuses the
    # base's replies
    settings = {"weights": weights_fingerprint(step), "max_new_tokens": rc.max_new_tokens,
                "temperature": rc.temperature, "seed": rc.seed, "chat": True}
    rows = [r for r in read_rows(prompts_art) if r.get("prompt") or r.get("messages")]
    conversations = [prompt_messages(r) for r in rows]
    name = f"replay-{_model_name(ctx.workspace, model_art)}"
    b = ctx.workspace.builder(name, stage="replay", config=settings, inputs=[model_art, prompts_art],
                              quiet=True)
    if not b.up_to_date:
        with b:
            done = _earlier_replies(ctx.workspace.path(name), settings)
            done.update({r["key"]: r["reply"] for r in _read_jsonl(b.work_dir / DONE)})
            todo = [c for c in conversations if prompt_key(c) not in done]
            b.stats.update(prompts=len(conversations), reused=len(conversations) - len(todo),
                           generated=len(todo))
            if todo:
                replay_model, tokenizer = (model, None) if rc.model is None and model is not None \
                    else load(str(step))
                tokenizer = tokenizer or _tokenizer(step)
                _generate(replay_model, tokenizer, todo, rc, b.work_dir / DONE, done)
            lines = [json.dumps({"key": prompt_key(c), "messages": c, "reply": done[prompt_key(c)]},
                                ensure_ascii=False) for c in conversations]
            (b.dir / REPLIES).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
            b.extra["provenance"] = {**settings, "model": str(step), "model_fingerprint": model_art.fingerprint,
                                     "prompts": str(prompts_art.path),
                                     "prompts_fingerprint": prompts_art.fingerprint}
        print(f"replay: {b.stats['generated']} replies generated, {b.stats['reused']} reused "
              f"({b.final})")
    replies = _read_jsonl(b.final / REPLIES)
    sft = [{"messages": [*r["messages"], {"role": "assistant", "content": r["reply"].strip()}]}
           for r in replies if r["reply"].strip()]
    return sft, {"artifact": name, "prompts": len(replies), "rows": len(sft)}


def _model_name(ws, art) -> str:
    """The model's artifact name; for a LoRA run's pinned copy of its base, the base's name."""

    if art.path.name == PINNED_BASE:
        for path in ws.artifacts():
            try:
                if json.loads((path / "manifest.json").read_text())["fingerprint"] == art.fingerprint:
                    return path.name
            except (OSError, ValueError, KeyError):
                continue
    return art.name


def _tokenizer(step: Path):
    return load_tokenizer(step)


def _earlier_replies(path: Path, settings: dict) -> dict:
    """{prompt key: reply} of the artifact in place when the same model and sampling made it."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    if manifest.get("config") != settings:
        return {}
    return {r["key"]: r["reply"] for r in _read_jsonl(path / REPLIES)}


def _generate(model, tokenizer, conversations: list[list[dict]], rc, done_file: Path, done: dict) -> None:
    """Replies in batches (`rc`: the replay section, a ReplayConfig), each appended to `done_file` (fsynced) as it finishes: a killed run
    loses at most the batch it was in."""
    from llmkit.model.decoding import generate_replies

    stop_ids = [i for i in (tokenizer.end_of_turn_id, tokenizer.eos_id) if i is not None]
    was_training = model.training
    model.eval()
    try:
        with done_file.open("a", encoding="utf-8") as out:
            for k in range(0, len(conversations), rc.batch_size):
                chunk = conversations[k:k + rc.batch_size]
                prompts = [tokenizer.encode_chat(c, add_generation_prompt=True)[0] for c in chunk]
                replies = generate_replies(model, prompts, stop_ids=stop_ids, pad_id=tokenizer.pad_id,
                                           max_new_tokens=rc.max_new_tokens, batch_size=rc.batch_size,
                                           temperature=rc.temperature, seed=rc.seed + k)
                for c, r in zip(chunk, replies):
                    key, text = prompt_key(c), tokenizer.decode(r)
                    done[key] = text
                    out.write(json.dumps({"key": key, "reply": text}, ensure_ascii=False) + "\n")
                out.flush()
                os.fsync(out.fileno())
    finally:
        model.train(was_training)
