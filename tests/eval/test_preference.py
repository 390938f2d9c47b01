from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn

from llmkit.eval.preference import judge_policies, pairwise_accuracy, reward_scores, win_rate


class LengthReward(nn.Module):
    """A reward model that prefers longer conversations: reward = number of real tokens."""

    def __init__(self, max_seq_len: int = 64):
        super().__init__()
        self.config = SimpleNamespace(max_seq_len=max_seq_len)
        self.seen = []

    def forward(self, input_ids, attention_mask):
        self.seen.append(input_ids)
        return attention_mask.sum(-1).float()


def test_rewards_are_read_from_the_chat_rendering_cut_to_the_model_length(tok):
    rm = LengthReward(max_seq_len=12)
    convs = [[{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}],
             [{"role": "user", "content": "计算 2+3" * 10}, {"role": "assistant", "content": "5"}]]
    got = reward_scores(rm, tok, convs, batch_size=8, device=torch.device("cpu"))
    assert got.tolist() == [min(len(tok.encode_chat(c)[0]), 12) for c in convs]
    assert rm.seen[0][0, :int(got[0])].tolist() == tok.encode_chat(convs[0])[0][:12]  # the first tokens


def test_pairwise_accuracy_counts_pairs_whose_chosen_reply_scores_higher(tok):
    rows = [{"prompt": "q", "chosen": "a longer reply", "rejected": "no"},
            {"prompt": "q", "chosen": "no", "rejected": "a longer reply"},
            {"prompt": "q", "chosen": "the best reply", "rejected": "ok"}]
    got = pairwise_accuracy(LengthReward(), tok, rows, batch_size=2, device=torch.device("cpu"))
    assert got["accuracy"] == pytest.approx(2 / 3) and got["pairs"] == 3
    assert got["mean_margin"] > 0


def test_win_rate_counts_ties_as_half():
    got = win_rate(np.array([2.0, 1.0, 0.5, 3.0]), np.array([1.0, 1.0, 0.7, 0.0]))
    assert got["win_rate"] == pytest.approx((1 + 0.5 + 0 + 1) / 4)
    assert got["ties"] == 1 and got["prompts"] == 4
    assert got["policy_reward"] == pytest.approx(1.625)


def test_judging_two_policies(tok):
    rows = [{"prompt": "What is 2+3?"}, {"prompt": "What is 4+4?"}]
    result, samples = judge_policies((LengthReward(), tok), rows, ["five, it is 5", "8"], ["5", "eight"],
                                     batch_size=4, device=torch.device("cpu"))
    assert result["win_rate"] == 0.5
    assert samples[0]["policy"] == "five, it is 5" and samples[0]["policy_reward"] > samples[0]["reference_reward"]
