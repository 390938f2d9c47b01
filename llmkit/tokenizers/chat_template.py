"""Chat templates rendered as transformers renders them, and where a rendered chat's replies are.

A template is jinja, compiled as transformers' `_compile_jinja_template` compiles it: a sandbox
(`ImmutableSandboxedEnvironment`, trim_blocks, lstrip_blocks), loop controls, the
`{% generation %}` tag, transformers' `tojson` (no HTML escaping), `raise_exception` and
`strftime_now`. It sees `messages`, `add_generation_prompt`, `tools` and `documents` (None), the
special tokens the tokenizer names (`bos_token`, `eos_token`, …) and the caller's switches
(`enable_thinking`), as `apply_chat_template` passes them.

The replies' characters (what an SFT model learns to write) come from the template's
`{% generation %}` blocks when it has them, the spans transformers' `return_assistant_tokens_mask`
uses. Otherwise `reply_spans` finds each message's content in the rendered text, in order:
an assistant reply is its content followed by the end-of-turn token, a span that covers both.
A template may write less than the content: trimmed (Llama 3's `| trim`) or, for a reply with a
reasoning block, only what follows `</think>` (Qwen3 and DeepSeek-R1 drop the reasoning of
earlier turns); the span is what the rendered text holds of that turn.
"""

from __future__ import annotations

import json
import re
from contextvars import ContextVar
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

from llmkit.errors import UserError

TEMPLATE_FILE = "chat_template.jinja"
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
# (blocks rendered so far, spans found) while a render tracks its {% generation %} blocks
_TRACKING: ContextVar = ContextVar("llmkit_chat_generation", default=None)
_PROBE = [{"role": "user", "content": "llmkit probe: a question"},
          {"role": "assistant", "content": "llmkit probe: the reply"}]


def chat_template_of(directory: Path, config: dict) -> str | None:
    """The folder's chat template, as transformers picks it: chat_template.jinja, else
    tokenizer_config.json's `chat_template` (a string, or named templates: "default")."""
    file = Path(directory) / TEMPLATE_FILE
    if file.is_file():
        return file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def has_generation_blocks(template: str) -> bool:
    return bool(_GENERATION_TAG.search(template))


def checked_messages(messages: Sequence[dict]) -> list[dict]:
    """The messages as plain dicts; a UserError names the first without a string role and content."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise UserError(f"message {i}: a message needs a string `role`, got {m!r}")
        if not isinstance(m.get("content"), str):
            raise UserError(f"message {i} ({m['role']}): content must be a string, got {m.get('content')!r}")
        out.append(dict(m))
    return out


def render_chat(template: str, messages: Sequence[dict], add_generation_prompt: bool = False,
                special_tokens: dict | None = None, track_generation: bool = False,
                source: str = "the chat template", template_kwargs: dict | None = None,
                ) -> tuple[str, list[tuple[int, int]]]:
    """(the rendered chat, the character spans of its {% generation %} blocks when tracked, else
    []). `template_kwargs` are the template's own switches (Qwen3's and SmolLM3's
    `enable_thinking`), over the special tokens as apply_chat_template's keyword arguments are.
    A template that does not compile or refuses the chat (`raise_exception`) is a UserError
    naming `source`."""
    import jinja2

    try:
        compiled = _compiled(template)
        variables = {**(special_tokens or {}), **(template_kwargs or {}), "messages": list(messages), "tools": None,
                     "documents": None, "add_generation_prompt": add_generation_prompt}
        if not track_generation:
            return compiled.render(**variables), []
        blocks, spans = [], []
        tracking = _TRACKING.set((blocks, spans))
        try:
            for block in compiled.generate(**variables):
                blocks.append(block)
        finally:
            _TRACKING.reset(tracking)
        return "".join(blocks), spans
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"{source}: the chat template does not compile (line {e.lineno}: {e.message})") from None
    except jinja2.TemplateError as e:
        raise UserError(f"{source}: the chat template refused the conversation: {e}") from None


def end_of_turn_after_reply(template: str, special_tokens: dict, candidates: Iterable[str]) -> str | None:
    """The token of `candidates` (the special tokens) that the template writes right after an
    assistant reply, whitespace allowed between: ChatML's <|im_end|>, Llama 3's <|eot_id|>. None
    when it writes none there, or refuses a one-question conversation."""
    try:
        text, _ = render_chat(template, _PROBE, special_tokens=special_tokens)
    except UserError:
        return None
    reply = _PROBE[-1]["content"]
    at = text.rfind(reply)
    after = text[at + len(reply):].lstrip() if at >= 0 else ""
    return next((t for t in sorted(candidates, key=len, reverse=True) if t and after.startswith(t)), None)


def reply_spans(text: str, messages: Sequence[dict], end_of_turn: str,
                source: str = "the chat template") -> list[tuple[int, int]]:
    """The character span of each assistant reply in `text` (the rendered `messages`): its
    content as rendered, through the `end_of_turn` that follows. Each message is looked for
    after the one before it, so a reply is never found inside an earlier turn."""
    spans, cursor = [], 0
    for i, message in enumerate(messages):
        reply = message["role"] == "assistant"
        found = _rendered(text, message["content"], reply, re.escape(end_of_turn), cursor)
        if found is None and reply:
            raise UserError(f"{source}: assistant message {i} is not in the chat its template renders "
                            f"(not followed by {end_of_turn}), so which tokens to learn is unknown; "
                            "give the template {% generation %} blocks around what the assistant writes")
        if found is None:
            continue
        if reply:
            spans.append(found)
        cursor = found[1]
    return spans


def _rendered(text: str, content: str, reply: bool, end_of_turn: str, start: int):
    """The earliest (then longest) span at or after `start` that one of the forms a template
    writes of `content` takes, through the end of turn after it: required after a reply, taken
    when it directly follows any other message."""
    best = None
    for form in _forms(content, reply):
        gap = r"\s*" if form else ""  # an empty reply must not take the header's whitespace
        after = f"{gap}{end_of_turn}" if reply else f"(?:{gap}{end_of_turn})?"
        found = re.compile(re.escape(form) + after).search(text, start)
        if found and (best is None or (found.start(), -found.end()) < (best.start(), -best.end())):
            best = found
    return best.span() if best else None


def _forms(content: str, reply: bool) -> list[str]:
    forms = [content, content.strip()]
    if reply and "</think>" in content:
        forms.append(content.rsplit("</think>", 1)[1].strip())
    return list(dict.fromkeys(forms))


# -- the jinja environment, as transformers builds it ----------------------------------------

@lru_cache(maxsize=32)
def _compiled(template: str):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_generation_extension(), loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


@lru_cache(maxsize=1)
def _generation_extension():
    """The `{% generation %}…{% endgeneration %}` tag: renders its body and, while a render
    tracks, records where the body lands (after the blocks rendered so far, as transformers'
    AssistantTracker counts)."""
    import jinja2.nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_track"), [], [], body).set_lineno(lineno)

        def _track(self, caller):
            text = caller()
            tracking = _TRACKING.get()
            if tracking is not None:
                blocks, spans = tracking
                start = sum(map(len, blocks))
                spans.append((start, start + len(text)))
            return text

    return Generation


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' filter: jinja's own escapes HTML characters, which a prompt must keep
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message):
    import jinja2

    raise jinja2.TemplateError(message)


def _strftime_now(format):
    from datetime import datetime

    return datetime.now().strftime(format)
