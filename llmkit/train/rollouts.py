"""What a PPO rollout is made of: the prompts, the sampled responses as a scorer sees them, the
mask of their real tokens, and the minibatches cut from a rollout."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Prompt:
    ids: list[int]  # the prompt rendered for generation (chat template), as token ids
    answer: str | None = None  # the checkable answer, for the verifiable reward


@dataclass
class Samples:
    """Sampled responses as a scorer sees them, one row per sample."""

    input_ids: torch.Tensor       # [N, P + R] left-padded prompt, then the response
    attention_mask: torch.Tensor  # [N, P + R] 1 = real token
    prompt_len: int               # P
    response_mask: torch.Tensor   # [N, R] 1 = real response token (its stop token included)
    texts: list[str]              # decoded responses (stop token and padding left out)
    answers: list[str | None]     # each sample's prompt's answer

    @property
    def responses(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_len:]


def response_mask_of(responses: torch.Tensor, stop_ids: list[int]) -> torch.Tensor:
    """1 on each response token up to and including its first stop token, 0 after it."""
    if not stop_ids:
        return torch.ones_like(responses)
    is_stop = torch.isin(responses, torch.tensor(stop_ids, device=responses.device)).long()
    stops_before = is_stop.cumsum(-1) - is_stop  # stop tokens strictly before each position
    return (stops_before == 0).long()


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside a process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def select_rows(rollout: dict, rows: torch.Tensor) -> dict:
    """A minibatch: the rows `rows` of a rollout, trimmed to their longest response."""
    P = rollout["prompt_len"]
    width = max(int(rollout["response_mask"][rows].sum(-1).max()), 1)
    batch = {"prompt_len": P}
    for key, value in rollout.items():
        if key == "prompt_len":
            continue
        columns = P + width if key in ("input_ids", "attention_mask") else width
        batch[key] = value[rows, :columns]
    return batch


def strip_stop(tokens: list[int], stop_ids: list[int]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in stop_ids else tokens
