"""Verifiable rewards: score a response against the known `answer` of its prompt, no model needed.

The demo tasks (two-digit addition, string reversal) have one right answer, so a response is
right when it equals the answer up to whitespace: leading/trailing space is dropped and every
inner run of whitespace counts as one space (a model that writes "4 2" for "4  2" is right; one
that writes "42" for "4 2" is not, since inside a reversed string the space is content).
"""

from __future__ import annotations

from typing import Sequence


def normalize_answer(text: str) -> str:
    """The form two answers are compared in: trimmed, inner whitespace runs collapsed to one space."""
    return " ".join(text.split())


def exact_match(response: str, answer: str) -> bool:
    """True when the response is the answer, ignoring differences in whitespace."""
    return normalize_answer(response) == normalize_answer(answer)


def verify_rewards(responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    """1.0 for each response that matches its answer exactly (see `exact_match`), else 0.0."""
    if len(responses) != len(answers):
        raise ValueError(f"{len(responses)} responses but {len(answers)} answers")
    return [float(exact_match(r, a)) for r, a in zip(responses, answers)]
