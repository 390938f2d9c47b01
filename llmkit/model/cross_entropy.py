"""The model's own language-model loss: cross-entropy over the vocabulary computed in chunks of
positions, so the full [B, T, V] logits never exist. It sits beside the model, which calls it for
`model(..., targets=t)`, below the trainers' losses (`llmkit.train.losses`), which share its
IGNORE_INDEX.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100  # a target or label that no loss counts (Hugging Face's convention)


def chunked_cross_entropy(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                          label_smoothing: float = 0.0, chunk_size: int = 1024) -> torch.Tensor:
    """`F.cross_entropy(head(hidden).float(), targets, ignore_index=IGNORE_INDEX, label_smoothing=...)`
    without ever holding every position's logits; 0 when no target is labelled.

    `targets[..., t]` is the token that position t predicts (already shifted, unlike the trainers' `labels`).
    Logits are made chunk_size labelled positions at a time and reduced to a loss sum; backward
    makes each chunk's logits again (torch.utils.checkpoint), so at most one chunk's exist at once.
    `head` is the module, not its weight: ZeRO-3 gathers a module's parameters in its forward
    hooks, which fire for the recomputation too.
    """
    labelled = targets != IGNORE_INDEX
    hidden, targets = hidden[labelled], targets[labelled]
    if not len(targets):
        return hidden.float().sum()  # a zero that still backpropagates (engines call backward on it)
    total = 0.0
    for h, t in zip(hidden.split(chunk_size), targets.split(chunk_size)):
        if torch.is_grad_enabled():
            total = total + checkpoint(_loss_sum, head, h, t, label_smoothing, use_reentrant=False)
        else:
            total = total + _loss_sum(head, h, t, label_smoothing)
    return total / len(targets)


def _loss_sum(head, hidden, targets, label_smoothing):
    return F.cross_entropy(head(hidden).float(), targets, reduction="sum", label_smoothing=label_smoothing)
