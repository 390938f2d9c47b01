"""Reward functions written for TRL's GRPOTrainer (its reward_funcs signature), used unchanged by
`llmkit ppo --set reward=tests/assets/trl_style_rewards.py:…` (tests/rewards/test_plugins.py runs
both on the same completions)."""

import re


def content(completion):
    return completion if isinstance(completion, str) else completion[0]["content"]


def correct_answer(prompts, completions, answer, **kwargs):
    """1.0 when the completion's last number is the row's answer; None where the row has none."""
    rewards = []
    for completion, gold in zip(completions, answer):
        numbers = re.findall(r"-?\d+", content(completion))
        rewards.append(None if gold is None else float(bool(numbers) and numbers[-1] == str(gold)))
    return rewards


def brevity(completions, completion_ids, trainer_state, **kwargs):
    """Shorter is better, by tokens (the stop token counted); trainer_state as TRL gives it."""
    return [1.0 / (1 + len(ids)) + 0.0 * trainer_state.global_step for ids in completion_ids]


def echoes_the_prompt(prompts, completions, **kwargs):
    """The share of the prompt's words the completion repeats; a chat prompt is a message list."""
    rewards = []
    for prompt, completion in zip(prompts, completions):
        text = prompt if isinstance(prompt, str) else " ".join(m["content"] for m in prompt)
        words = set(text.lower().split())
        rewards.append(len(words & set(content(completion).lower().split())) / max(len(words), 1))
    return rewards


def fails_on_sevens(completions, **kwargs):
    """Raises on a completion holding a 7 (a bug in a user's reward): llmkit scores it None."""
    rewards = []
    for completion in completions:
        if "7" in content(completion):
            raise ValueError("cannot judge a seven")
        rewards.append(0.5)
    return rewards
