"""What a PPO rollout is made of: the prompts, the responses sampled for them as a scorer sees
them, the mask of their real tokens, the statistics pooled over processes, and the minibatches cut
from a rollout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from llmkit.checkpoints.loading import merged_copy
from llmkit.checkpoints.lora import adapters_of
from llmkit.data.chat import prompt_messages
from llmkit.model.decoding import generate, left_pad
from llmkit.model.packed_linear import TRAINING_SHARE, available_memory, packing_available
from llmkit.errors import UserError


@dataclass
class Prompt:
    ids: list[int]  # the prompt rendered for generation (chat template), as token ids
    answer: str | None = None  # the checkable answer, for the verifiable reward
    row: dict | None = None  # its dataset row: reward functions read its columns
    # what a reward function is given as the prompt, as TRL gives it: the row's `prompt` string,
    # or a chat row's turns up to the reply (then the completion is an assistant message too)
    reward_prompt: str | list | None = None


def rollout_prompts(tokenizer, rows: list[dict], room: int, where, needs_answer: bool):
    """(the prompts of `rows` rendered for generation, how many rows were dropped because their
    prompt is longer than `room` tokens: seq_len less max_new_tokens)."""

    prompts, dropped = [], 0
    for row in rows:
        if row.get("prompt") is None and not row.get("messages"):
            raise UserError(f"{where}: row {row.get('id')!r} has no prompt; ingest prompts with "
                            "`llmkit ingest --kind prompt`")
        answer = row.get("answer")
        if needs_answer and answer is None:
            raise UserError(f"{where}: row {row.get('id')!r} has no `answer`, which the verifiable "
                            "reward checks; give every row an answer or pass --reward RM")
        ids, _ = tokenizer.encode_chat(prompt_messages(row), add_generation_prompt=True)
        if len(ids) > room:
            dropped += 1
            continue
        reward_prompt = prompt_messages(row) if row.get("messages") else row["prompt"]
        prompts.append(Prompt(ids, None if answer is None else str(answer), row, reward_prompt))
    if not prompts:
        raise UserError(f"{where}: no prompt leaves room for a reply: each needs at most {room} tokens "
                        "(seq_len - max_new_tokens)")
    return prompts, dropped


@dataclass
class Samples:
    """Sampled responses as a scorer sees them, one row per sample."""

    input_ids: torch.Tensor       # [N, P + R] left-padded prompt, then the response
    attention_mask: torch.Tensor  # [N, P + R] 1 = real token
    prompt_len: int               # P
    response_mask: torch.Tensor   # [N, R] 1 = real response token (its stop token included)
    texts: list[str]              # decoded responses (stop token and padding left out)
    answers: list[str | None]     # each sample's prompt's answer
    prompts: list[Prompt] | None = None  # each sample's prompt (its row, for reward functions)
    # tool rollouts (train.tool_rollouts): whether the last turn reached its stop token, and the
    # tool metrics; response_mask is then 0 on the tool results' tokens between the turns
    stopped: torch.Tensor | None = None
    metrics: dict | None = None

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


def sampling_model(policy):
    """What a rollout samples through: on CPU, a LoRA policy's merged copy (`merged_copy`) while its
    adapted layers' float32 copies fit in a share of the free memory, for llmkit's one-call decoding
    steps take plain layers only (SmolLM2, LoRA r 16, 32 rows x 64 int8-weight tokens at 1 thread:
    6.6 s with the copy made and converted, 8.9 s through peft's layers); else the policy itself."""
    if (not packing_available(policy) or adapters_of(policy) is None
            or any(hasattr(p, "ds_id") for p in policy.parameters())):  # ZeRO-3 holds partitions
        return policy
    frozen = sum(m.weight.nbytes for m in policy.modules()
                 if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad)
    return (merged_copy(policy) if frozen < available_memory() * TRAINING_SHARE else None) or policy


@torch.no_grad()
def sample_responses(policy, prompts: list[Prompt], *, max_new_tokens: int, temperature: float,
                     stop_ids: list[int], pad_id: int, decode: Callable[[list[int]], str],
                     device) -> Samples:
    """One response per prompt from `policy` with the KV cache, sampled from the whole
    distribution at `temperature`, each cut after its first stop token."""
    ids, mask = left_pad([p.ids for p in prompts], pad_id)
    ids, mask = ids.to(device), mask.to(device)
    max_new = min(max_new_tokens, policy.config.max_seq_len - ids.shape[1])
    if max_new < 1:
        raise ValueError(f"a prompt of {ids.shape[1]} tokens leaves no room to respond within "
                         f"model.max_seq_len={policy.config.max_seq_len}")
    out = generate(policy, ids, max_new, temperature=temperature,
                   eos_id=stop_ids[0] if stop_ids else None, attention_mask=mask)
    P = ids.shape[1]
    response_mask = response_mask_of(out[:, P:], stop_ids)
    responses = out[:, P:].masked_fill(response_mask == 0, pad_id)
    texts = [decode(strip_stop(r[m.bool()].tolist(), stop_ids)) for r, m in zip(responses, response_mask)]
    return Samples(torch.cat([ids, responses], 1), torch.cat([mask, response_mask], 1), P,
                   response_mask, texts, [p.answer for p in prompts], list(prompts))


def ends_with_stop(responses: torch.Tensor, response_mask: torch.Tensor,
                   stop_ids: list[int]) -> torch.Tensor:
    """[N] bool: the response reached a stop token within the generation budget."""
    if not stop_ids:
        return torch.zeros(len(responses), dtype=torch.bool, device=responses.device)
    is_stop = torch.isin(responses, torch.tensor(stop_ids, device=responses.device))
    return (is_stop & response_mask.bool()).any(-1)


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside a process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def summed_over_processes(x: torch.Tensor) -> torch.Tensor:
    """x summed element-wise over every process of the process group (x itself outside one).
    Every process must call it; x lives on the group's device (a GPU under NCCL)."""
    import torch.distributed as dist

    if rank_and_world()[1] == 1:
        return x
    x = x.clone()
    dist.all_reduce(x)
    return x


def mean_over_processes(values: torch.Tensor) -> tuple[float, int]:
    """(mean, count) of `values` [N] pooled over every process (this process's alone outside a
    process group): what a statistic every process must agree on is computed from."""
    pooled = summed_over_processes(torch.stack([values.double().sum(),
                                                values.new_tensor(len(values), dtype=torch.float64)]))
    total, count = pooled.tolist()
    return total / count, int(count)


def gathered_over_processes(x: torch.Tensor) -> torch.Tensor:
    """Every process's x (the same shape on each), concatenated in rank order along dim 0."""
    import torch.distributed as dist

    world = rank_and_world()[1]
    if world == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def over_processes(statistic: Callable[[torch.Tensor], torch.Tensor], values: torch.Tensor,
                   pooled: bool) -> torch.Tensor:
    """statistic(values) [N] for this process's N rows: of every process's values (in rank order)
    when `pooled`, as TRL computes a statistic of the whole generation batch; else of this
    process's alone, which is the same for one that only reads groups (they never straddle
    processes)."""
    if not pooled:
        return statistic(values)
    rank, n = rank_and_world()[0], len(values)
    return statistic(gathered_over_processes(values))[rank * n:(rank + 1) * n]


def select_rows(rollout: dict, rows: torch.Tensor) -> dict:
    """A minibatch: the rows `rows` of a rollout, trimmed to their longest response."""
    P = rollout["prompt_len"]
    # the real tokens, not response_mask: a tool rollout's mask has holes (the tool results)
    width = max(int(rollout["attention_mask"][rows, P:].sum(-1).max()), 1)
    batch = {"prompt_len": P}
    for key, value in rollout.items():
        if key == "prompt_len":
            continue
        columns = P + width if key in ("input_ids", "attention_mask") else width
        batch[key] = value[rows, :columns]
    return batch


def strip_stop(tokens: list[int], stop_ids: list[int]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in stop_ids else tokens
