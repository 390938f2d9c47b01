"""The ship check of `llmkit export --format gguf --check` (`--set ship_check=true`): the written file
run as its users run it, through llama.cpp's chat path (llama-cpp-python: the file's own chat
template, its tokenizer, its end-of-generation tokens), on a few held-out chats:
- the template: each chat rendered by the binding's chat formatter from the file's
  `tokenizer.chat_template` (what `Llama.create_chat_completion` renders) and tokenised by
  llama.cpp is the token sequence `llmkit generate` starts from; the token the template writes
  after an assistant reply is one llama.cpp ends generation at (`llama_vocab_is_eog`);
- the stops: each greedy reply ends at an end-of-generation token before `max_tokens` — a file
  whose eos/eot ids name another token than the model's end of turn is the "never stops in
  Ollama / llama.cpp" of every fine-tuning tracker;
- the replies: llama.cpp's greedy tokens against llmkit's own model's, counted; a reply that
  differs is reported with the gap between the two best next tokens in llmkit's fp32 model where
  it first differs (a near tie, below `near_tie`, is rounding: f16 weights meet f16 activations
  in llama.cpp). In an f16/bf16/f32 file every difference must be a near tie (a wrong layout
  diverges at once and everywhere); a quantised file's count is reported, not judged (its
  quality is perplexity's to say).

`ship_check` returns the record export writes into llmkit_export.json and the manifest; its
`failures` name what failed. Where llama-cpp-python is not installed it returns a record that
says the check was skipped and why."""

from __future__ import annotations

import json
from pathlib import Path

from llmkit.errors import UserError
from llmkit.generation import encode_prompt
from llmkit.tokenizers.chat_template import end_of_turn_after_reply

# a few held-out chats, English and Chinese, the languages llmkit's recipes train on
SHIP_PROMPTS = ("What is the capital of France?", "Write one short sentence about the sea.",
                "Give me two tips for sleeping well.", "请用一句话介绍一下你自己。")
UNQUANTISED = ("f16", "bf16", "f32")
SKIPPED = "llama.cpp's Python binding is not installed (`make llama-cpp` builds it): no ship check was run"


class ShipCheckFailed(Exception):
    """The file failed the ship check: the CLI prints `failures` and exits 1."""

    def __init__(self, path: Path, failures: list[str], record: dict | None = None):
        self.path, self.failures, self.record = path, failures, record or {}
        super().__init__(f"{path} failed the ship check: " + "; ".join(failures))


def read_prompts(path: str) -> list:
    """Chats of a JSONL file: rows with `prompt` (a string: one user turn) or `messages`."""
    source = Path(path)
    if not source.is_file():
        raise UserError(f"ship_prompts: {source} does not exist")
    prompts = []
    for n, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{source} line {n}: not JSON ({e.msg})") from None
        prompt = row.get("messages") or row.get("prompt") if isinstance(row, dict) else None
        if not prompt:
            raise UserError(f"{source} line {n}: a ship-check row needs `prompt` or `messages`")
        prompts.append(prompt)
    if not prompts:
        raise UserError(f"ship_prompts: {source} holds no rows")
    return prompts


def as_messages(prompt) -> list[dict]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def ship_check(path: Path, model, tokenizer, quant: str, prompts=SHIP_PROMPTS, max_tokens: int = 64,
               near_tie: float = 0.05, threads: int = 1) -> dict:
    """Run the GGUF file `path` through llama.cpp's chat path and compare it with llmkit's `model`
    (fp32, eval mode) and `tokenizer`; the record (see the module docstring). llama.cpp runs on
    one thread by default: the check measures no speed, and llama.cpp's threads spin-wait for each
    other, which on a busy machine costs many times the work."""
    try:
        import llama_cpp
    except ImportError:
        return {"skipped": SKIPPED, "passed": None, "failures": []}

    chats = [as_messages(p) for p in prompts]
    ours_prompts = [encode_prompt(tokenizer, chat, True) for chat in chats]
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=max(map(len, ours_prompts)) + max_tokens + 8,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    try:
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        template = llm.metadata.get("tokenizer.chat_template")
        failures = []
        if not template:
            return {"engine": engine(), "passed": False,
                    "failures": [f"{path.name} holds no chat template (tokenizer.chat_template)"]}
        theirs_prompts, template_failures = rendered_by_llama_cpp(llm, template, chats, ours_prompts)
        failures += template_failures
        end, end_failure = end_of_turn(llm, vocab, template)
        failures += [end_failure] if end_failure else []
        theirs = [llama_cpp_reply(llm, vocab, ids, max_tokens) for ids in theirs_prompts]
    finally:
        llm.close()
    ours = [llmkit_reply(model, ids, tokenizer.stop_ids, max_tokens) for ids in ours_prompts]
    unstopped = [i for i, (reply, stopped) in enumerate(theirs, 1) if not stopped]
    # a reply llmkit's own model does not end within the limit either is the model's (a greedy loop, a
    # long answer), not the file's: both fail the check, the message tells them apart
    model_too = [i for i in unstopped if not (ours[i - 1] and ours[i - 1][-1] in tokenizer.stop_ids)]
    if unstopped:
        ours_end = sorted({tokenizer.decode([r[-1]]) or str(r[-1]) for r in ours if r and r[-1] in tokenizer.stop_ids})
        failures.append(f"{len(unstopped)} of {len(chats)} replies did not stop within {max_tokens} tokens "
                        f"(prompt {', '.join(map(str, unstopped[:5]))}): llama.cpp ends generation at "
                        f"{eog_names(llm_vocab_texts(path), path)}, llmkit's model ends its replies with "
                        f"{', '.join(ours_end) or 'no stop token within the limit either'}; "
                        f"{len(model_too)} of them run past the limit in llmkit's own model too")
    differing = []
    for i, ((reply, _), mine, prompt) in enumerate(zip(theirs, ours, ours_prompts), 1):
        at = first_difference(mine, reply)
        if at is not None:
            differing.append({"prompt": i, "position": at, "gap": round(top_two_gap(model, prompt + mine[:at]), 4)})
    near = [d for d in differing if d["gap"] < near_tie]
    if quant in UNQUANTISED and len(near) < len(differing):
        far = [d for d in differing if d["gap"] >= near_tie]
        failures.append(f"{len(far)} greedy replies differ from llmkit's model where its best token leads by "
                        f"{near_tie} or more (prompt {', '.join(str(d['prompt']) for d in far[:5])}): an "
                        f"unquantised file should differ at near ties only")
    return {"engine": engine(), "prompts": len(chats), "max_tokens": max_tokens,
            "template_equal": len(chats) - sum(a != b for a, b in zip(ours_prompts, theirs_prompts)),
            "end_of_turn": end, "stops": len(chats) - len(unstopped), "unstopped_in_llmkit_too": len(model_too),
            "reply_tokens": [len(r) for r, _ in theirs], "replies_equal": len(chats) - len(differing),
            "near_ties": len(near), "differing": differing, "near_tie": near_tie,
            "passed": not failures, "failures": failures}


def engine() -> str:
    import llama_cpp

    return f"llama-cpp-python {llama_cpp.__version__}"


def rendered_by_llama_cpp(llm, template: str, chats, ours_prompts) -> tuple[list[list[int]], list[str]]:
    """Each chat as llama-cpp-python's chat path turns it into tokens (its Jinja2ChatFormatter over
    the file's template with the file's bos/eos texts, then llama.cpp's tokenizer, no bos added:
    the formatter's text carries its own), and a failure per chat that differs from llmkit's ids."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    bos, eos = llm.token_bos(), llm.token_eos()
    formatter = Jinja2ChatFormatter(template=template, eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
                                    bos_token=llm._model.token_get_text(bos) if bos != -1 else "")
    out, failures = [], []
    for i, (chat, ours) in enumerate(zip(chats, ours_prompts), 1):
        try:
            text = formatter(messages=chat).prompt
        except Exception as e:  # the binding's jinja refusing the template is what its users would meet
            failures.append(f"chat template: llama-cpp-python cannot render prompt {i} ({type(e).__name__}: {e})")
            out.append(ours)
            continue
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        out.append(ids)
        if ids != ours:
            at = first_difference(ours, ids)
            failures.append(f"chat template: the file's template renders prompt {i} differently from llmkit's "
                            f"(token {at}: llmkit {llm_piece(llm, ours, at)!r}, llama.cpp {llm_piece(llm, ids, at)!r})")
    return out, failures


def llm_piece(llm, ids: list[int], at: int) -> str:
    if at >= len(ids):
        return "<end of prompt>"
    return llm._model.token_get_text(ids[at])


def end_of_turn(llm, vocab, template: str) -> tuple[str | None, str | None]:
    """(the token the file's template writes after an assistant reply, a failure when it writes
    none or one llama.cpp does not stop at)."""
    import llama_cpp


    texts = {llm._model.token_get_text(i): i for i in range(llm.n_vocab())
             if llama_cpp.llama_vocab_get_attr(vocab, i) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL}
    bos, eos = llm.token_bos(), llm.token_eos()
    special = {"bos_token": llm._model.token_get_text(bos) if bos != -1 else "",
               "eos_token": llm._model.token_get_text(eos) if eos != -1 else ""}
    end = end_of_turn_after_reply(template, special, texts)
    if end is None:
        return None, ("chat template: it writes no end-of-turn token after an assistant reply, so a model "
                      "trained on it has no token to stop at")
    if not llama_cpp.llama_vocab_is_eog(vocab, texts[end]):
        return end, (f"chat template: it ends a reply with {end} (id {texts[end]}), which is not among the file's "
                     "end-of-generation tokens (tokenizer.ggml.eos_token_id / eot_token_id): llama.cpp and "
                     "Ollama would generate past it")
    return end, None


def llama_cpp_reply(llm, vocab, prompt: list[int], max_tokens: int) -> tuple[list[int], bool]:
    """(greedy reply tokens, whether it ended at an end-of-generation token), the end token
    included as `llmkit generate` includes its stop token."""
    import llama_cpp
    import numpy as np

    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(max_tokens):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        out.append(int(np.argmax(logits)))
        if llama_cpp.llama_vocab_is_eog(vocab, out[-1]):
            return out, True
        llm.eval(out[-1:])
    return out, False


def llmkit_reply(model, prompt: list[int], stop_ids, max_tokens: int) -> list[int]:
    """llmkit's greedy reply, up to and including its first stop token."""
    import torch

    from llmkit.model.decoding import generate

    with torch.no_grad():
        ids = generate(model, torch.tensor([prompt]), max_tokens, greedy=True, eos_id=stop_ids[0])[0, len(prompt):]
    ids = ids.tolist()
    end = next((i for i, t in enumerate(ids) if t in stop_ids), None)
    return ids if end is None else ids[:end + 1]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (one ending earlier counts), None if equal."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def top_two_gap(model, ids: list[int]) -> float:
    """How far the likeliest next token's logit is ahead of the second's, in llmkit's model."""
    import torch

    with torch.no_grad():
        best = model(torch.tensor([ids]))[0, -1].float().topk(2).values
    return float(best[0] - best[1])


def llm_vocab_texts(path: Path) -> dict:
    """The file's eos/eot ids and token texts (read with gguf, which the binding does not expose)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = reader.fields
    ids = {k: int(fields[f"tokenizer.ggml.{k}_token_id"].contents()) for k in ("eos", "eot")
           if f"tokenizer.ggml.{k}_token_id" in fields}
    tokens = fields["tokenizer.ggml.tokens"].contents()
    return {k: (i, tokens[i]) for k, i in ids.items()}


def eog_names(named: dict, path: Path) -> str:
    return ", ".join(f"{k} {text} (id {i})" for k, (i, text) in named.items()) or f"no eos/eot id in {path.name}"


def summary(record: dict) -> str:
    """One line for export's summary table."""
    if record.get("skipped"):
        return "skipped: llama-cpp-python not installed"
    if "stops" not in record:
        return "FAILED: " + "; ".join(record["failures"])
    n = record["prompts"]
    line = (f"{record['stops']}/{n} replies stop at {record['end_of_turn']}, template {record['template_equal']}/{n}, "
            f"greedy equal to llmkit {record['replies_equal']}/{n}"
            + (f" ({record['near_ties']} near ties)" if record["near_ties"] else ""))
    return ("passed: " if record["passed"] else "FAILED: ") + line
