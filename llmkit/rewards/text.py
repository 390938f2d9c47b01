"""The rewards llmkit writes on a completion's text, as reward functions with TRL's signature
(`llmkit.rewards.plugins`): `format` (the completion has a format) and `verify` (it equals the
row's answer, `llmkit.rewards.verify`)."""

from __future__ import annotations

import re
from typing import Callable

from llmkit.errors import ConfigError
from llmkit.rewards import verify

# TRL's think_format_reward: <think>…</think>, one think block, then anything
THINK_FORMAT = r"^<think>(?!.*<think>)(.*?)</think>.*$"


def completion_text(completion) -> str:
    """A completion as text: itself, or the contents of its messages (a chat completion)."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion)


def format_reward_of(pattern: str | None) -> Callable:
    """1.0 where the completion has the format, else 0.0: the whole completion matches `pattern`,
    or (None) TRL's think_format_reward's reasoning tags: `<think>…</think>` then the answer."""
    if pattern is None:
        regex, match = re.compile(THINK_FORMAT, re.DOTALL | re.MULTILINE), "match"
    else:
        try:
            regex, match = re.compile(pattern, re.DOTALL), "fullmatch"
        except re.error as e:
            raise ConfigError(f"reward_format: {pattern!r} is not a regular expression ({e})") from None

    def format_reward(completions, **kwargs) -> list[float]:
        return [1.0 if getattr(regex, match)(completion_text(c)) else 0.0 for c in completions]

    return format_reward


def verify_reward_of(partial_credit: bool) -> Callable:
    """llmkit's verifiable reward as a reward function: 1.0 where the reply equals the row's
    `answer` up to whitespace, else 0.0 or (partial credit) its similarity to the answer."""

    def verify_reward(completions, answer, **kwargs) -> list[float | None]:
        texts = [completion_text(c) for c in completions]
        known = [i for i, a in enumerate(answer) if a is not None]
        scores = verify.verify_rewards([texts[i] for i in known], [str(answer[i]) for i in known], partial_credit)
        out: list[float | None] = [None] * len(texts)
        for i, s in zip(known, scores):
            out[i] = s
        return out

    return verify_reward


format_reward = format_reward_of(None)
verify_reward = verify_reward_of(False)
