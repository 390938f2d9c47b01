"""Reference formulas the tests hold the trainers' computations to: the plain, full-logits form
of a loss, which the package computes another way (only at labelled positions, in chunks)."""

import torch
import torch.nn.functional as F

from llmkit.train.losses import IGNORE_INDEX, token_logps


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor, average: bool = False) -> torch.Tensor:
    """Sum (or mean, with `average`) of the labelled tokens' log-probabilities, per row: [B]."""
    logps, mask = token_logps(logits, labels)
    total = logps.sum(-1)
    return total / mask.sum(-1).clamp(min=1) if average else total


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the labelled (assistant) tokens of the whole batch."""
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(),
                           ignore_index=IGNORE_INDEX)
