"""What `llmkit synth` hands a generator and gets back, the same for a local model and a server
(no torch here: a run against a server never loads it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Raw:
    """A prompt given as tokens (`ids`) rather than a chat; `text` is what a server is sent."""
    ids: tuple
    text: str


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    top_k: int | None
    max_new_tokens: int

    @classmethod
    def of(cls, cfg) -> "Sampling":
        """The sampling settings of a SynthConfig."""
        return cls(cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_new_tokens)


GREEDY_VERDICT = Sampling(0.0, 1.0, None, 4)  # a written yes/no (a server's judge)


@dataclass(frozen=True)
class Completion:
    text: str
    new_tokens: int
    stopped: bool  # it ended with a stop token (not cut at max_new_tokens)
    special: bool = False  # a special token (a role marker) came before the stop
