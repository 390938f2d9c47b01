"""Verifiable rewards: score a response against the known `answer` of its prompt, no model needed.

The demo task (string reversal) has one right answer, so a response is right when it equals
the answer up to whitespace: leading/trailing space is dropped and every inner run of whitespace
counts as one space (a model that writes "c b" for "c  b" is right; one that writes "cb" for
"c b" is not, since inside a reversed string the space is content).

Partial credit (`partial=True`) scores a wrong response by its similarity to the answer,
1 − edit distance / length of the longer: a reply wrong in one character of six earns 0.83, an
empty reply 0, the answer itself 1. RL then learns from near misses too, where exact match
would give a group of wrong samples nothing to tell apart.

As a reward function of `llmkit ppo` (`--set reward=verify`): `llmkit.rewards.text.verify_reward`.
"""

from __future__ import annotations

from typing import Sequence


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
