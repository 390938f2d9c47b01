"""Who judges `llmkit synth`'s rows: the generators and judges a task opens, once per process.

- qa's grounding check asks a generator `yes_probability` (the same model, or `--set judge=RUN`).
- pairs' judge answers `margins(prompts, first, second)` (> 0: the first reply is better):
  a reward-model run (`--set judge=RM_RUN`, an `llmkit rm` run: the difference of its scores),
  or a generative judge — a model comparing the replies in both orders
  (`llmkit.judge.model_judge.judge_pairs`): `--set judge=RUN` of another stage, or without a
  judge the model that wrote the replies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llmkit.checkpoints.loading import load_reward_model, load_tokenizer
from llmkit.errors import UserError
from llmkit.eval.preference import reward_scores
from llmkit.judge.model_judge import judge_pairs
from llmkit.model.decode_weights import DecodeConfig
from llmkit.synth.client import ServerGenerator
from llmkit.synth.engine import LocalGenerator

_REWARD: dict = {}  # path -> RewardJudge, one per process


@dataclass(frozen=True)
class Models:
    """Where a task's models are: the generator (`model`: a step folder; or a server) and the
    judge (`judge`: a step folder, `judge_is_rm` when it is a reward model)."""
    model: str | None
    judge: str | None
    judge_is_rm: bool
    server: object  # ServerConfig
    server_model: str
    device: str
    batch_size: int
    judge_combine: str = "agree"
    weights: str = "fp32"  # decode.weights: what the local models' CPU products multiply by


def open_generator(models: Models):
    if models.server.url:
        s = models.server
        return ServerGenerator(s.url, models.server_model, timeout=s.timeout, retries=s.retries,
                               backoff=s.backoff, concurrency=s.concurrency)
    return LocalGenerator.open(models.model, models.device, models.batch_size, models.weights)


def grounding_judge(models: Models, gen):
    """What asks qa's grounding question: the judge run, else the generator itself."""
    if models.judge is None:
        return gen
    return LocalGenerator.open(models.judge, models.device, models.batch_size, models.weights)


def pair_judge(models: Models, gen):
    if models.judge_is_rm:
        if models.judge not in _REWARD:
            _REWARD[models.judge] = RewardJudge(models.judge, models.device, models.batch_size)
        return _REWARD[models.judge]
    if models.judge is None and not isinstance(gen, LocalGenerator):
        raise UserError("synth --kind pairs against a server needs a local judge: --set judge=RUN "
                        "(an rm run, or a model that compares the replies)")
    judge = gen if models.judge is None else LocalGenerator.open(models.judge, models.device,
                                                                 models.batch_size, models.weights)
    return ModelPairJudge(judge, models.judge_combine)


class RewardJudge:
    """A reward model's score of each reply, the first's minus the second's."""

    def __init__(self, step_dir: str, device: str, batch_size: int):
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.model, self.tokenizer = load_reward_model(step_dir), load_tokenizer(step_dir)
        self.batch_size = batch_size

    def margins(self, prompts: list, first: list[str], second: list[str]) -> list[float]:
        def scores(replies):
            return reward_scores(self.model, self.tokenizer,
                                 [p + [{"role": "assistant", "content": r}] for p, r in zip(prompts, replies)],
                                 batch_size=self.batch_size, device=self.device)

        return (np.asarray(scores(first)) - np.asarray(scores(second))).tolist()


class ModelPairJudge:
    """A language model comparing the two replies in both orders (position bias cancelled):
    +|p_a - p_b| when it prefers the first, minus that for the second, 0 for a tie."""

    def __init__(self, gen: LocalGenerator, combine: str = "agree"):
        self.gen, self.combine = gen, combine

    def margins(self, prompts: list, first: list[str], second: list[str]) -> list[float]:
        verdicts = judge_pairs(self.gen.model, self.gen.tokenizer, list(zip(prompts, first, second)),
                               batch_size=self.gen.batch_size, combine=self.combine,
                               decode=DecodeConfig(self.gen.weights))
        sign = {"a": 1.0, "b": -1.0, "tie": 0.0}
        return [sign[v.choice] * max(abs(v.p_a - v.p_b), 1e-6) for v in verdicts]
