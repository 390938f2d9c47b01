"""Judging with a reward model: its pairwise accuracy on preference data, and the win rate of a
policy against a reference policy.

- Pairwise accuracy: the share of pairs whose `chosen` reply the reward model scores above the
  `rejected` one (strictly), with the mean margin r(chosen) − r(rejected).
- Win rate: both policies reply to the same prompts (greedy unless a temperature is set), the
  reward model scores each reply, and the policy wins a prompt when its reply scores higher
  (a tie counts one half).

Conversations are rendered with the reward model's own chat template and tokenizer, as in its
training, and cut to its max_seq_len (the first tokens are kept, as training does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmkit.data.chat import prompt_messages
from llmkit.errors import ConfigError
from llmkit.eval.generation import prompt_ids


@dataclass
class RewardConfig:
    model: str | None = None        # reward-model run (workspace name or path) that judges
    preferences: str | None = None  # pairs (prompt, chosen, rejected) for pairwise accuracy: file or dataset
    prompts: str | None = None      # prompts for the win rate: file or dataset
    reference: str | None = None    # checkpoint run the evaluated policy is compared with
    max_new_tokens: int = 64        # reply length limit of both policies
    temperature: float = 0.0        # 0 = greedy replies
    max_rows: int | None = 500      # at most this many pairs / prompts
    batch_size: int = 16            # conversations per reward-model forward / prompts per generate

    def __post_init__(self):
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ConfigError("reward.max_new_tokens and reward.batch_size must be ≥ 1")
        if self.temperature < 0:
            raise ConfigError(f"reward.temperature must be ≥ 0, got {self.temperature}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"reward.max_rows must be ≥ 1, got {self.max_rows}")


def reward_scores(reward_model, tokenizer, conversations: list[list[dict]], *, batch_size: int,
                  device) -> np.ndarray:
    """The reward model's score of each conversation (ending with the reply that is judged)."""
    import torch

    max_len = reward_model.config.max_seq_len
    encoded = [tokenizer.encode_chat(c)[0][:max_len] for c in conversations]
    reward_model = reward_model.to(device).eval()
    out = np.zeros(len(encoded))
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start:start + batch_size]
        width = max(len(ids) for ids in chunk)
        ids = torch.full((len(chunk), width), tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, seq in enumerate(chunk):
            ids[r, :len(seq)] = torch.tensor(seq)
            mask[r, :len(seq)] = 1
        with torch.inference_mode():
            out[start:start + len(chunk)] = reward_model(ids.to(device), mask.to(device)).float().cpu().numpy()
    return out


def _with_reply(row: dict, reply: str) -> list[dict]:
    return prompt_messages(row) + [{"role": "assistant", "content": reply}]


def pairwise_accuracy(reward_model, tokenizer, rows: list[dict], *, batch_size: int, device) -> dict:
    chosen = reward_scores(reward_model, tokenizer, [_with_reply(r, r["chosen"]) for r in rows],
                           batch_size=batch_size, device=device)
    rejected = reward_scores(reward_model, tokenizer, [_with_reply(r, r["rejected"]) for r in rows],
                             batch_size=batch_size, device=device)
    margin = chosen - rejected
    return {"accuracy": float(np.mean(margin > 0)), "mean_margin": float(np.mean(margin)),
            "pairs": len(rows)}


def win_rate(policy_rewards: np.ndarray, reference_rewards: np.ndarray) -> dict:
    wins = np.sign(policy_rewards - reference_rewards)
    return {"win_rate": float(np.mean((wins + 1) / 2)), "ties": int(np.sum(wins == 0)),
            "policy_reward": float(np.mean(policy_rewards)),
            "reference_reward": float(np.mean(reference_rewards)), "prompts": len(wins)}


def policy_replies(model, tokenizer, rows: list[dict], cfg: RewardConfig, *, chat: bool, device,
                   seed: int = 0) -> list[str]:
    from llmkit.model.decoding import generate_replies

    prompts = [prompt_ids(tokenizer, r, chat, f"prompt row {i + 1}") for i, r in enumerate(rows)]
    stop_ids = [tokenizer.end_of_turn_id, tokenizer.eos_id] if chat else [tokenizer.eos_id]
    replies = generate_replies(model.to(device).eval(), prompts, stop_ids=stop_ids,
                               pad_id=tokenizer.pad_id, max_new_tokens=cfg.max_new_tokens,
                               batch_size=cfg.batch_size, temperature=cfg.temperature, seed=seed)
    return [tokenizer.decode(r).strip() for r in replies]


def judge_policies(judge, rows: list[dict], policy_texts: list[str], reference_texts: list[str], *,
                   batch_size: int, device) -> tuple[dict, list[dict]]:
    """Win rate of the policy's replies over the reference's, and the judged samples.
    `judge` is (reward model, its tokenizer)."""
    reward_model, tokenizer = judge

    def score(texts):
        return reward_scores(reward_model, tokenizer, [_with_reply(r, t) for r, t in zip(rows, texts)],
                             batch_size=batch_size, device=device)

    policy, reference = score(policy_texts), score(reference_texts)
    samples = [{"prompt": r.get("prompt"), "policy": p, "reference": q,
                "policy_reward": float(a), "reference_reward": float(b)}
               for r, p, q, a, b in zip(rows, policy_texts, reference_texts, policy, reference)]
    return win_rate(policy, reference), samples
