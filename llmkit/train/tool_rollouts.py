"""Multi-turn rollouts with tools (`--set tools=…`, grpo and rloo): the policy replies, each
`<tool_call>` in its reply runs (`llmkit.rewards.tools`), the results come back through the chat
template's tool-role markup, and the policy replies again — up to `max_tool_turns` rounds of
tools, then its last reply is the answer the rewards read.

A sample's response columns hold every turn in order: the model's own tokens (each turn's stop
token included) and, between them, the tokens the template writes around the tool results. The
attention mask is 1 on all of them (the policy reads the results), the response mask — what the
policy loss and the KL count — 1 on the model's own tokens alone: a tool's text is not the
policy's action.

The tool-role markup is the template's own: the tokens between the end of the assistant turn that
called and the start of the next assistant turn, as `encode_chat` renders the conversation with
the results as `tool` messages (Qwen2.5/3 write them as a user turn of `<tool_response>` blocks).
A template that knows no tool role (llmkit's own chat format) gets that same form: a user turn
`<tool_response>\\nRESULT\\n</tool_response>`. Tools are not described to the model by the
template (no `tools=` schema is rendered): the prompts or the SFT data teach the calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from llmkit.data.chat import prompt_messages
from llmkit.model.decoding import generate, left_pad
from llmkit.rewards.tools import load_tools, parse_tool_calls, run_tool_call, tool_files
from llmkit.train.rollouts import Prompt, Samples, rollout_prompts, strip_stop
from llmkit.rewards.math import answers_equal
from llmkit.core.workspace import Artifact
from llmkit.data.ingest import file_fingerprint
from llmkit.data.input_files import FILE_STAGE


@dataclass
class ToolSetup:
    """The tools of a run and how their results reach the model."""
    tools: dict[str, Callable]
    tokenizer: object  # renders the tool-role markup (`encode_chat`)
    max_turns: int = 3  # rounds of tool calls before the reply must be the answer
    timeout: float = 5.0  # seconds a tool call may run


def tool_setup(cfg, tokenizer) -> ToolSetup | None:
    """The tools `cfg` (a PpoConfig) names, or None without any."""
    if not cfg.tools:
        return None
    return ToolSetup(load_tools(cfg.tools), tokenizer, cfg.max_tool_turns, cfg.tool_timeout)


def tool_message(tokenizer, text: str) -> dict:
    """A tool result as a message the template renders: role `tool` where it knows one."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if "tool" in template:
        return {"role": "tool", "content": text}
    return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}


def tool_turn_ids(tokenizer, history: list[dict], reply: str, results: list[str]) -> list[int]:
    """The ids that follow the end-of-turn token of the assistant `reply` (after `history`) up to
    the next assistant turn's start: the template's rendering of the tool `results`. Found by
    counting end-of-turn tokens, so a template that renders the last assistant turn differently
    from an earlier one (Qwen3's reasoning block) is still cut at the right place."""
    eot = tokenizer.stop_ids[0]
    before, _ = tokenizer.encode_chat(history)
    after, _ = tokenizer.encode_chat([*history, {"role": "assistant", "content": reply},
                                      *(tool_message(tokenizer, r) for r in results)],
                                     add_generation_prompt=True)
    ends = [i for i, t in enumerate(after) if t == eot]
    turns_before = sum(t == eot for t in before)
    if len(ends) <= turns_before:
        raise ValueError("the chat template writes no end of turn after an assistant reply")
    return after[ends[turns_before] + 1:]


@dataclass
class Conversation:
    prompt: Prompt
    history: list[dict]  # the messages so far, as the template renders them
    tokens: list[int] = field(default_factory=list)  # the response columns: every turn
    learn: list[int] = field(default_factory=list)  # 1 on the model's own tokens
    answer_text: str = ""  # the last reply (stop token left out): what the rewards read
    stopped: bool = False  # the last reply ended with its stop token
    done: bool = False


def policy_turns(policy, temperature: float, stop_ids: list[int], pad_id: int, device, greedy=False):
    """`sample(contexts, max_new) -> replies`: the policy's next turn after each context (token
    ids), sampled with the KV cache, each cut after its first stop token (kept)."""

    def sample(contexts: list[list[int]], max_new: int) -> list[list[int]]:
        ids, mask = left_pad(contexts, pad_id)
        out = generate(policy, ids.to(device), max_new, temperature=temperature, greedy=greedy,
                       eos_id=stop_ids[0] if stop_ids else None, attention_mask=mask.to(device))
        replies = []
        for row in out[:, ids.shape[1]:].tolist():
            cut = min((row.index(s) + 1 for s in stop_ids if s in row), default=len(row))
            replies.append(row[:cut])
        return replies

    return sample


@torch.no_grad()
def sample_tool_responses(policy, prompts: list[Prompt], setup: ToolSetup, *, max_new_tokens: int,
                          temperature: float, stop_ids: list[int], pad_id: int,
                          decode: Callable[[list[int]], str], device, sample_turn=None,
                          greedy: bool = False) -> Samples:
    """One multi-turn response per prompt (see the module's docstring); `max_new_tokens` bounds
    each of the model's turns, the model's max_seq_len the whole conversation. `sample_turn`
    replaces the policy's sampling (tests script the replies)."""
    sample_turn = sample_turn or policy_turns(policy, temperature, stop_ids, pad_id, device, greedy)
    window = policy.config.max_seq_len
    conversations = [Conversation(p, prompt_messages(p.row) if p.row else []) for p in prompts]
    calls = errors = at_limit = 0
    for turn in range(setup.max_turns + 1):
        live = [c for c in conversations if not c.done]
        if not live:
            break
        contexts = [c.prompt.ids + c.tokens for c in live]
        budget = min(max_new_tokens, window - max(map(len, contexts)))
        if budget < 1:  # no room for another turn: the conversation ends cut off
            for c in live:
                c.done, c.stopped = True, False
            break
        for c, reply in zip(live, sample_turn(contexts, budget)):
            c.tokens += reply
            c.learn += [1] * len(reply)
            c.stopped = bool(reply) and reply[-1] in stop_ids
            c.answer_text = decode(strip_stop(reply, stop_ids))
            requested = parse_tool_calls(c.answer_text)
            if not (c.stopped and requested):
                c.done = True
                continue
            if turn == setup.max_turns:  # a call past the limit is not run: this reply is the answer
                c.done, at_limit = True, at_limit + 1
                continue
            results = [run_tool_call(call, setup.tools, setup.timeout) for call in requested]
            calls, errors = calls + len(results), errors + sum(not r.ok for r in results)
            texts = [r.text for r in results]
            inserted = tool_turn_ids(setup.tokenizer, c.history, c.answer_text, texts)
            c.history += [{"role": "assistant", "content": c.answer_text},
                          *(tool_message(setup.tokenizer, t) for t in texts)]
            if len(c.prompt.ids) + len(c.tokens) + len(inserted) >= window:
                c.done, c.stopped = True, False  # the results do not fit: cut off
                continue
            c.tokens += inserted
            c.learn += [0] * len(inserted)
    samples = _as_samples(conversations, pad_id)
    n = max(len(conversations), 1)
    samples.metrics = {"tool_calls": calls / n, "tool_errors": float(errors), "tool_turn_limit": float(at_limit)}
    return move(samples, device)


def _as_samples(conversations: list[Conversation], pad_id: int) -> Samples:
    ids, prompt_mask = left_pad([c.prompt.ids for c in conversations], pad_id)
    width = max(1, max(len(c.tokens) for c in conversations))
    responses = torch.full((len(conversations), width), pad_id, dtype=ids.dtype)
    real = torch.zeros_like(responses)
    learn = torch.zeros_like(responses)
    for i, c in enumerate(conversations):
        responses[i, :len(c.tokens)] = torch.tensor(c.tokens, dtype=ids.dtype)
        real[i, :len(c.tokens)] = 1
        learn[i, :len(c.learn)] = torch.tensor(c.learn, dtype=ids.dtype)
    return Samples(torch.cat([ids, responses], 1), torch.cat([prompt_mask.to(real.dtype), real], 1),
                   ids.shape[1], learn, [c.answer_text for c in conversations],
                   [c.prompt.answer for c in conversations], [c.prompt for c in conversations],
                   stopped=torch.tensor([c.stopped for c in conversations]))


def move(samples: Samples, device) -> Samples:
    """The samples' tensors on `device` (rollouts live where the policy does)."""
    samples.input_ids = samples.input_ids.to(device)
    samples.attention_mask = samples.attention_mask.to(device)
    samples.response_mask = samples.response_mask.to(device)
    samples.stopped = samples.stopped.to(device)
    return samples


def tool_accuracy(model, tokenizer, records: list[dict], setup: ToolSetup, max_new_tokens: int,
                  batch_size: int = 32) -> float | None:
    """Share of `records` whose greedy multi-turn answer (tools called) states the row's answer,
    by math equivalence (`llmkit.rewards.math`); None without records."""

    if not records:
        return None
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    prompts, _ = rollout_prompts(tokenizer, records, model.config.max_seq_len - max_new_tokens,
                                 "held-out prompts", needs_answer=True)
    right = 0
    for start in range(0, len(prompts), batch_size):
        samples = sample_tool_responses(model, prompts[start:start + batch_size], setup,
                                        max_new_tokens=max_new_tokens, temperature=1.0,
                                        stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id,
                                        decode=tokenizer.decode, device=device, greedy=True)
        right += sum(answers_equal(a, t) for a, t in zip(samples.answers, samples.texts))
    model.train(was_training)
    return right / len(records)


def tool_inputs(cfg) -> list:
    """The tools' Python files as inputs of the run (editing one makes it stale), each loaded
    now so that a missing file or function exits 2 before anything trains."""

    if not cfg.tools:
        return []
    load_tools(cfg.tools)
    return [Artifact(f, {"fingerprint": file_fingerprint(f), "stage": FILE_STAGE}) for f in tool_files(cfg.tools)]
