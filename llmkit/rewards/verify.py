"""Verifiable rewards: score a response against the known `answer` of its prompt, no model needed.

The demo task (string reversal) has one right answer, so a response is right when it equals
the answer up to whitespace: leading/trailing space is dropped and every inner run of whitespace
counts as one space (a model that writes "c b" for "c  b" is right; one that writes "cb" for
"c b" is not, since inside a reversed string the space is content).

Partial credit (`partial=True`) scores a wrong response by its similarity to the answer,
1 − edit distance / length of the longer: a reply wrong in one character of six earns 0.83, an
empty reply 0, the answer itself 1. RL then learns from near misses too, where exact match
would give a group of wrong samples nothing to tell apart.

The scorers at the end give PPO / GRPO one score per sampled response (`train.ppo.Samples`):
the verifiable reward, a reward model's score, or their weighted sum.
"""

from __future__ import annotations

from typing import Callable, Sequence

from llmkit.errors import ConfigError


def normalize_answer(text: str) -> str:
    """The form two answers are compared in: trimmed, inner whitespace runs collapsed to one space."""
    return " ".join(text.split())


def exact_match(response: str, answer: str) -> bool:
    """True when the response is the answer, ignoring differences in whitespace."""
    return normalize_answer(response) == normalize_answer(answer)


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest single-character insertions, deletions and
    substitutions that turn a into b."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def answer_similarity(response: str, answer: str) -> float:
    """1 − edit distance / length of the longer, on the normalised forms: 1.0 exactly when
    `exact_match` holds, 0.0 when nothing lines up."""
    r, a = normalize_answer(response), normalize_answer(answer)
    longer = max(len(r), len(a))
    return 1.0 - edit_distance(r, a) / longer if longer else 1.0


def verify_rewards(responses: Sequence[str], answers: Sequence[str],
                   partial: bool = False) -> list[float]:
    """For each response: 1.0 if it matches its answer (see `exact_match`), else 0.0, or with
    `partial` its `answer_similarity`."""
    if len(responses) != len(answers):
        raise ValueError(f"{len(responses)} responses but {len(answers)} answers")
    if partial:
        return [answer_similarity(r, a) for r, a in zip(responses, answers)]
    return [float(exact_match(r, a)) for r, a in zip(responses, answers)]


# -- scorers of sampled responses (PPO / GRPO) --------------------------------------------------

Scorer = Callable  # (train.ppo.Samples) -> torch.Tensor [N]: one score per sampled response


def verify_scorer(partial: bool = False) -> Scorer:
    """1 for a response that equals its prompt's answer (up to whitespace), else 0 — or, with
    partial credit, its similarity to the answer (`answer_similarity`)."""
    import torch

    def score(samples):
        if any(a is None for a in samples.answers):
            raise ValueError("the verifiable reward needs an answer for every prompt")
        return torch.tensor(verify_rewards(samples.texts, samples.answers, partial))

    return score


def reward_model_scorer(reward_model) -> Scorer:
    """The reward model's score of prompt + response, read at the response's last token."""

    def score(samples):
        device = samples.input_ids.device
        return reward_model.to(device)(samples.input_ids, samples.attention_mask).float()

    return score


def mixed_scorer(reward_model, verify_weight: float, partial: bool = False) -> Scorer:
    """Reward-model score plus verify_weight × the verifiable reward."""
    by_model, by_answer = reward_model_scorer(reward_model), verify_scorer(partial)

    def score(samples):
        return by_model(samples) + verify_weight * by_answer(samples).to(samples.input_ids.device)

    return score


def reward_mode(requested: str, has_reward_model: bool) -> str:
    """model | verify | mix for ppo's `reward` setting (auto: the reward model if one is given,
    else verify), checked against what was given."""
    mode = requested if requested != "auto" else ("model" if has_reward_model else "verify")
    if mode in ("model", "mix") and not has_reward_model:
        raise ConfigError(f"reward={mode} needs a reward model: pass --reward RM (a `llmkit rm` "
                          "run), or use reward=verify")
    return mode


def rollout_scorer(mode: str, reward_model, verify_weight: float, partial: bool) -> Scorer:
    """The score of each sampled response under reward `mode` (see `reward_mode`)."""
    if mode == "model":
        return reward_model_scorer(reward_model)
    if mode == "verify":
        return verify_scorer(partial)
    return mixed_scorer(reward_model, verify_weight, partial)
