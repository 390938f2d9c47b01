"""An Ollama Modelfile beside each GGUF file `llmkit export --format gguf` writes: `ollama create NAME -f
Modelfile` in that folder makes the model, chatting as llmkit's chat template chats.

- FROM the file beside it;
- TEMPLATE: the model's jinja chat template in Ollama's Go-template syntax. It is not translated
  from the jinja source (no Go template engine reads jinja): the jinja template renders chats
  whose contents are markers, and the text around each marker is a turn's prefix or suffix —
  the same for the families llmkit chats in (ChatML: Qwen2/2.5/3, SmolLM2; Llama 3; llmkit's own
  `<|user|>…<|end|>`). The Go template writes those strings around Ollama's `.System` and
  `.Messages`; a chat that ends with a user turn renders as the jinja template renders it (the
  file's bos aside, which llama.cpp adds itself). As in Ollama's own templates, a last assistant
  message is left open (a reply to continue) and system messages reach the template as `.System`.
- SYSTEM: the system prompt the jinja template writes when a chat has none (SmolLM2's "You are a
  helpful AI assistant named SmolLM…", Qwen2.5's "You are Qwen…"); Ollama passes it as `.System`.
- PARAMETER stop: the texts of the tokens that end a reply (the tokenizer's end of turn and eos).

A template whose turns do not come apart so (tools, per-turn logic beyond a default system
prompt) gets no TEMPLATE line, and export says so: Ollama then guesses one from the file's
`tokenizer.chat_template` itself."""

from __future__ import annotations

import json

from llmkit.errors import UserError
from llmkit.tokenizers.chat_template import render_chat

MODELFILE = "Modelfile"
# marker contents: plain words, so that a template's `| trim` or `.strip()` leaves them as they are
SYSTEM, USER, REPLY, NEXT = "llmkitSYSTEMmarker", "llmkitUSERmarker", "llmkitREPLYmarker", "llmkitNEXTmarker"
BOS = "llmkitBOSmarker"  # stands for bos_token: text that merely starts like the bos (SmolLM2's is <|im_start|>) is no bos


def turn_strings(template: str, special_tokens: dict) -> dict | None:
    """The strings the jinja `template` writes around each turn (system_prefix, system_suffix,
    user_prefix, user_suffix, assistant_prefix, assistant_suffix, generation, default_system,
    always_system, bos), or None when its turns do not come apart as one prefix and suffix per role."""
    def render(messages, generation=False):
        try:
            return render_chat(template, messages, generation, special_tokens={**special_tokens, "bos_token": BOS})[0]
        except UserError:
            return None

    user, system, reply, nxt = ({"role": r, "content": c} for r, c in
                                (("user", USER), ("system", SYSTEM), ("assistant", REPLY), ("user", NEXT)))
    one, one_open = render([user]), render([user], True)
    three, with_system = render([user, reply, nxt]), render([system, user])
    if None in (one, one_open, three, with_system) or not one_open.startswith(one):
        return None
    bos = BOS if one.startswith(BOS) else ""  # the template writes bos_token first: llama.cpp adds it itself
    user_suffix = three[three.index(NEXT) + len(NEXT):]
    between_user_reply = three[three.index(USER) + len(USER):three.index(REPLY)]
    between_reply_next = three[three.index(REPLY) + len(REPLY):three.index(NEXT)]
    if not (between_user_reply.startswith(user_suffix) and between_reply_next.startswith(user_suffix)):
        return None
    # every family llmkit chats in closes a reply as it closes a question (ChatML's <|im_end|>\n)
    strings = {"bos": bos, "user_suffix": user_suffix, "assistant_suffix": user_suffix,
               "assistant_prefix": between_user_reply[len(user_suffix):],
               "user_prefix": between_reply_next[len(user_suffix):], "generation": one_open[len(one):]}
    head = one[len(bos):one.index(USER)]  # what comes before the first question: a default system turn?
    system_head = with_system[len(bos):with_system.index(SYSTEM)]
    system_tail = with_system[with_system.index(SYSTEM) + len(SYSTEM):with_system.index(USER)]
    if not (head.endswith(strings["user_prefix"]) and system_tail.endswith(strings["user_prefix"])
            and three[len(bos):three.index(USER)] == head):
        return None
    default_turn = head[:len(head) - len(strings["user_prefix"])]
    strings.update(system_prefix=system_head, system_suffix=system_tail[:len(system_tail) - len(strings["user_prefix"])])
    if not default_turn:
        strings.update(default_system="", always_system=False)
    elif default_turn.startswith(system_head) and default_turn.endswith(strings["system_suffix"]):
        default = default_turn[len(system_head):len(default_turn) - len(strings["system_suffix"])]
        strings.update(default_system=default, always_system=not default)  # Llama 3.2: an empty one is written
    else:
        return None
    strings["bos"] = (special_tokens.get("bos_token") or "") if bos else ""
    if any(BOS in v for v in strings.values() if isinstance(v, str)):
        return None  # a bos_token within the turns: not one of the families here
    return strings


def go_template(strings: dict) -> str:
    """Ollama's TEMPLATE for the turn strings (Go's text/template over .System and .Messages); the
    literal text goes in as quoted Go strings, so that the `{{-` trims never eat a newline of it."""
    def q(key):
        return "{{ " + json.dumps(strings[key], ensure_ascii=False) + " }}"

    system = q("system_prefix") + "{{ .System }}" + q("system_suffix")
    return "\n".join([
        system if strings["always_system"] else "{{- if .System }}" + system + "{{ end }}",
        "{{- range $i, $_ := .Messages }}",
        "{{- $last := eq (len (slice $.Messages $i)) 1 }}",
        '{{- if eq .Role "user" }}' + q("user_prefix") + "{{ .Content }}" + q("user_suffix"),
        '{{- else if eq .Role "assistant" }}' + q("assistant_prefix") + "{{ .Content }}"
        + "{{ if not $last }}" + q("assistant_suffix") + "{{ end }}",
        "{{- end }}",
        '{{- if and $last (ne .Role "assistant") }}' + q("generation") + "{{ end }}",
        "{{- end }}"])


def modelfile(gguf_name: str, template: str | None, special_tokens: dict, stops: list[str]) -> tuple[str, bool]:
    """(the Modelfile's text, whether it holds a TEMPLATE)."""
    lines = [f"# written by llmkit export: ollama create NAME -f {MODELFILE}", f"FROM ./{gguf_name}"]
    strings = turn_strings(template, special_tokens) if template else None
    if strings:
        lines.append(f'TEMPLATE """{go_template(strings)}"""')
        if strings["default_system"]:
            lines.append(f'SYSTEM """{strings["default_system"]}"""')
    lines += [f"PARAMETER stop {json.dumps(s, ensure_ascii=False)}" for s in dict.fromkeys(stops) if s]
    return "\n".join(lines) + "\n", strings is not None


def write_modelfile(out_dir, gguf_name: str, vocab, tokenizer) -> dict:
    """Write `out_dir/Modelfile` for the GGUF file `gguf_name` (its vocab as written); the record's
    entries."""
    tokens = vocab.tokens
    special = {f"{k}_token": tokens[i] for k, i in vocab.special_ids.items() if k in ("bos", "eos") and i is not None}
    stops = [tokens[i] for i in tokenizer.stop_ids if i is not None and 0 <= i < len(tokens)]
    text, templated = modelfile(gguf_name, vocab.chat_template, special, stops)
    (out_dir / MODELFILE).write_text(text, encoding="utf-8")
    if not templated:
        print(f"note: the chat template's turns do not come apart into a prefix and a suffix per role, so "
              f"{MODELFILE} has no TEMPLATE: Ollama guesses one from the GGUF file's chat template")
    return {"modelfile": MODELFILE, "modelfile_template": templated, "stop": list(dict.fromkeys(stops))}
