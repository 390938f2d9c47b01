"""A read record as rows of its kind's schema (text, sft, preference, prompt, feedback), or the
reason it has none: what `llmkit ingest` (`llmkit.data.ingest`, whose docstring lists each
kind's columns) writes of each record, one pure function per kind.
"""

from __future__ import annotations

import json

from llmkit.tokenizers.cjk import language_of


def _text(value) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _missing(rec: dict, key: str) -> str:
    if key not in rec or rec[key] is None:
        return f"missing_{key}"
    if isinstance(rec[key], str):
        return f"empty_{key}"
    return f"non_string_{key}"


def normalise(rec, cfg) -> list[dict] | str:
    """A record as rows of `cfg.kind`'s schema, or the reason it has none (`cfg`: the
    `IngestConfig`, whose kind, text_field and id_field it reads)."""
    if not isinstance(rec, dict):
        return "record_not_object"
    if cfg.kind == "text":
        text = _text(rec.get(cfg.text_field))
        if text is None:
            return _missing(rec, cfg.text_field)
        extra = {k: _carry(v) for k, v in rec.items() if k not in (cfg.text_field, cfg.id_field)}
        if not extra.get("lang"):  # a record's own label wins
            extra["lang"] = language_of(text)
        return [{"text": text, **extra}]
    if cfg.kind == "sft":
        return _sft_row(rec)
    if cfg.kind == "preference":
        return _preference_rows(rec)
    if cfg.kind == "feedback":
        return _feedback_rows(rec)
    prompt = _text(rec.get("prompt")) or _text(rec.get("instruction"))
    if prompt is None:
        return _missing(rec, "prompt")
    extra = {k: _carry(v) for k, v in rec.items() if k not in ("prompt", "instruction", "id")}
    return [{"prompt": prompt, "text": prompt, **extra}]


def _carry(value):
    """Extra fields become string columns, so batches from different files share a schema."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _sft_row(rec: dict) -> list[dict] | str:
    if "messages" in rec:
        msgs = rec["messages"]
        if not (isinstance(msgs, list) and msgs and all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in msgs)):
            return "malformed_messages"
        if not any(m["role"] == "assistant" for m in msgs):
            return "no_assistant_turn"
        msgs = [{"role": m["role"], "content": m["content"]} for m in msgs]
        text = "\n".join(m["content"] for m in msgs)
        return [{"messages": msgs, "prompt": None, "response": None, "text": text}]
    prompt = _text(rec.get("prompt")) or _text(rec.get("instruction"))
    if prompt is None:
        return _missing(rec, "instruction" if "instruction" in rec else "prompt")
    if _text(rec.get("input")):
        prompt = f"{prompt}\n\n{rec['input']}"
    response = _text(rec.get("response")) or _text(rec.get("output"))
    if response is None:
        return _missing(rec, "response")
    return [{"messages": None, "prompt": prompt, "response": response,
             "text": f"{prompt}\n{response}"}]


def _preference_rows(rec: dict) -> list[dict] | str:
    prompt = _text(rec.get("prompt"))
    if prompt is None:
        return _missing(rec, "prompt")
    if "responses" in rec:  # ranked best first: every ordered pair is a preference
        ranked = rec["responses"]
        if not (isinstance(ranked, list) and len(ranked) >= 2 and all(map(_text, ranked))):
            return "malformed_responses"
        pairs = [(ranked[i], ranked[j]) for i in range(len(ranked))
                 for j in range(i + 1, len(ranked))]
    else:
        chosen, rejected = _text(rec.get("chosen")), _text(rec.get("rejected"))
        if chosen is None:
            return _missing(rec, "chosen")
        if rejected is None:
            return _missing(rec, "rejected")
        pairs = [(chosen, rejected)]
    if any(c.strip() == r.strip() for c, r in pairs):  # nothing to prefer: a zero gradient
        return "repeated_response" if "responses" in rec else "chosen_equals_rejected"
    return [{"prompt": prompt, "chosen": c, "rejected": r, "text": f"{prompt}\n{c}"}
            for c, r in pairs]


FEEDBACK_FIELDS = ("id", "prompt", "completion", "label", "messages", "chosen", "rejected")
LABELS = {"true": True, "false": False, "1": True, "0": False}


def _label(value) -> bool | None:
    """true/false as JSON writes them, 1/0, or their text (a CSV column)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return LABELS.get(value.strip().lower()) if isinstance(value, str) else None


def _messages(value) -> list[dict] | None:
    if isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    return None


def _feedback_rows(rec: dict) -> list[dict] | str:
    """Rows of (prompt turns, completion, label): TRL's unpaired preference records (prompt and
    completion as text or messages), `messages` + label, or a pair unpaired."""
    extra = {k: _carry(v) for k, v in rec.items() if k not in FEEDBACK_FIELDS}
    if ("chosen" in rec and "rejected" in rec or "responses" in rec) and "label" not in rec:
        pairs = _preference_rows(rec)
        if isinstance(pairs, str):
            return pairs
        # a ranked list: its best reply desirable, every other one ranked below it undesirable
        ranked = [pairs[0]["chosen"], *(p["rejected"] for p in pairs if p["chosen"] == pairs[0]["chosen"])]
        prompt = [{"role": "user", "content": pairs[0]["prompt"]}]
        return [_feedback_row(prompt, reply, k == 0, extra) for k, reply in enumerate(ranked)]
    if "label" not in rec or rec["label"] is None:
        return "missing_label"
    label = _label(rec["label"])
    if label is None:
        return "invalid_label"
    if "messages" in rec and "completion" not in rec:
        msgs = _messages(rec["messages"])
        if msgs is None:
            return "malformed_messages"
        if msgs[-1]["role"] != "assistant":
            return "no_assistant_turn"
        if len(msgs) == 1:
            return "missing_prompt"
        return [_feedback_row(msgs[:-1], msgs[-1]["content"], label, extra)]
    prompt = _messages(rec.get("prompt")) or (
        [{"role": "user", "content": rec["prompt"]}] if _text(rec.get("prompt")) else None)
    if prompt is None:
        return "malformed_messages" if isinstance(rec.get("prompt"), list) else _missing(rec, "prompt")
    completion = rec.get("completion")
    if isinstance(completion, list):  # TRL's conversational form: one assistant message
        turns = _messages(completion)
        if not turns or len(turns) != 1 or turns[0]["role"] != "assistant":
            return "malformed_messages"
        completion = turns[0]["content"]
    if _text(completion) is None:
        return _missing(rec, "completion")
    return [_feedback_row(prompt, completion, label, extra)]


def _feedback_row(prompt: list[dict], completion: str, label: bool, extra: dict) -> dict:
    """A single user turn is stored as `prompt`; a longer conversation as `messages`, the
    completion its last turn (what `llmkit.data.chat.prompt_messages` reads back)."""
    single = len(prompt) == 1 and prompt[0]["role"] == "user"
    return {"prompt": prompt[0]["content"] if single else None,
            "messages": None if single else [*prompt, {"role": "assistant", "content": completion}],
            "completion": completion, "label": label,
            "text": "\n".join([*(m["content"] for m in prompt), completion]), **extra}
