"""`llmkit synth`'s settings: the kind of data it makes, how it samples, where the model runs.

Everything a row depends on — the kind, the sampling settings, the seed, the styles, the
prompts' language — is fingerprinted, so a rerun with the same settings and inputs is up to
date and any change rebuilds. How the requests travel (`server.timeout`, `server.retries`,
`server.concurrency`) is not: the same rows whichever way they were fetched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from llmkit.core.executor import RUN_OPTION
from llmkit.data.driver import DataConfig
from llmkit.errors import ConfigError
from llmkit.model.decode_weights import DecodeConfig

# kind -> (what it reads: None, "prompts" or "documents"; the dataset it writes)
KINDS = {
    "instructions": (None, "prompt"),
    "answers": ("prompts", "sft"),
    "qa": ("documents", "sft"),
    "rephrase": ("documents", "text"),
    "pairs": ("prompts", "preference"),
}
STYLES = ("wikipedia", "qa", "simple", "textbook")
# (temperature, top_p) where the config leaves them null. Magpie samples a user turn at
# temperature 1 for diversity; top_p 0.9 cuts the tail a small model drifts into and never comes
# back from (SmolLM2-135M at top_p 1: one sample in eight wandered into gibberish and never closed
# its turn; bench/results/2026-12-07-synth.md) — nucleus sampling's purpose, the top_p Magpie
# uses where it lowers sampling (Qwen2.5-Math) and the one SmolLM2's model card suggests.
SAMPLING = {"instructions": (1.0, 0.9)}
REPLY_SAMPLING = (0.7, 1.0)


@dataclass
class ServerConfig:
    url: str | None = None  # an OpenAI-compatible server (http://host:port or …/v1): requests go there instead of --from's model
    model: str | None = None  # the model name sent with each request (null: --from's name)
    timeout: float = field(default=120.0, metadata=RUN_OPTION)  # seconds a request may take before it is retried
    retries: int = field(default=5, metadata=RUN_OPTION)  # further tries of a failed request (connection, timeout, 429, 5xx)
    backoff: float = field(default=1.0, metadata=RUN_OPTION)  # seconds before the first retry, doubled at each one
    concurrency: int = field(default=8, metadata=RUN_OPTION)  # requests in flight at once

    def __post_init__(self):
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"server.url must start with http:// or https://, got {self.url!r}")
        if self.timeout <= 0 or self.retries < 0 or self.backoff < 0 or self.concurrency < 1:
            raise ConfigError("server.timeout must be > 0, server.retries and server.backoff ≥ 0, "
                              "server.concurrency ≥ 1")


@dataclass
class SynthConfig(DataConfig):
    kind: str | None = None  # instructions | answers | qa | rephrase | pairs (--kind)
    rows: int = 100  # instructions: how many to sample (kinds that read no dataset)
    n: int = 1  # answers: samples per prompt (pairs always take two)
    temperature: float | None = None  # softmax temperature; 0 = greedy; null = the kind's: instructions 1.0 (Magpie's), the others 0.7
    top_p: float | None = None  # sample among the likeliest tokens whose probabilities sum to top_p; null = the kind's: instructions 0.9 (cuts the tail a small model drifts into), the others 1.0
    top_k: int | None = None  # sample among the k likeliest tokens only; null = all
    max_new_tokens: int = 256  # tokens generated per reply at most
    seed: int = 0  # sampling seed: with the same inputs and settings, the same bytes
    keep_truncated: bool = False  # keep replies cut at max_new_tokens (else removed: cut_at_max_new_tokens)
    styles: list[str] = field(default_factory=lambda: ["wikipedia", "qa", "simple"])  # rephrase: the styles each document is rewritten in
    language: Literal["auto", "en", "zh"] = "auto"  # qa, rephrase: the prompts' language; auto = zh for rows whose lang is zh
    max_document_chars: int = 4000  # qa, rephrase: a longer document is cut to its first this many characters
    judge: str | None = None  # qa: a run that checks the answers (null: --from's model); pairs: an rm run that scores both replies, or a model that compares them (null: --from's model)
    grounding: Literal["ask", "likelihood"] = "ask"  # qa: ask the judge whether the answer is supported (P(yes)), or measure how much the document raises the answer's likelihood
    min_support: float = 0.5  # qa, grounding=ask: keep an answer the judge finds supported with at least this probability
    min_gain: float = 2.0  # qa, grounding=likelihood: keep an answer whose log-likelihood per token the document raises by at least this (nats)
    judge_combine: Literal["agree", "mean"] = "agree"  # pairs, a model judge: agree = a side wins when both orders pick it (else a tie); mean = the likelier side over both orders
    rows_per_task: int = 64  # input rows (or instructions) per sealed task: the unit a rerun resumes from
    batch_size: int = 16  # prompts generated together
    device: str = "auto"  # auto (cuda when available), cpu, cuda, cuda:N
    server: ServerConfig = field(default_factory=ServerConfig)  # an OpenAI-compatible server instead of a local model
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # decode.weights=bf16|f16|int8: a local model's (and judge's) CPU products

    def __post_init__(self):
        if self.kind is not None and self.kind not in KINDS:
            raise ConfigError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        # the kind's sampling where none is set: the manifest and fingerprint hold the values used
        temperature, top_p = SAMPLING.get(self.kind, REPLY_SAMPLING)
        self.temperature = temperature if self.temperature is None else self.temperature
        self.top_p = top_p if self.top_p is None else self.top_p
        for name in ("rows", "n", "max_new_tokens", "rows_per_task", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"synth {name} must be ≥ 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ConfigError(f"synth temperature must be ≥ 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"synth top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"synth top_k must be ≥ 1 or null, got {self.top_k}")
        if not 0 <= self.min_support <= 1:
            raise ConfigError(f"synth min_support must be in [0, 1], got {self.min_support}")
        if self.max_document_chars < 1:
            raise ConfigError(f"synth max_document_chars must be ≥ 1, got {self.max_document_chars}")
        bad = [s for s in self.styles if s not in STYLES]
        if bad or not self.styles:
            raise ConfigError(f"synth styles must be a non-empty list of {', '.join(STYLES)}, got "
                              f"{self.styles}")

    @property
    def reads(self) -> str | None:
        return KINDS[self.kind][0]

    @property
    def writes(self) -> str:
        return KINDS[self.kind][1]
