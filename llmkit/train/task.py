"""What a trainer adds to the shared loop (`Task`: its model, batches and loss), and moving a
batch to the device."""

from __future__ import annotations

import math

# the key under which the engine gives each training batch the step's item count per
# micro-batch (see Task.items_in_batch)
ITEMS_PER_MICRO_BATCH = "items_per_micro_batch"


class Task:
    """What one trainer adds to the shared loop: the model, its batches and its loss.

    Implement `loss(model, batch) -> (loss_tensor, {name: float or 0-dim tensor})`; the metrics
    are averaged over micro-batches and processes and logged beside the loss (every process must
    return the same keys). Return device tensors rather than `.item()`: the engine reduces them
    all with one host sync per optimizer step. `model` is the DeepSpeed engine: compute the loss
    from what calling it returns — ZeRO-3 gathers and reduces parameters in its forward — and
    read module attributes such as `model.aux_loss` through it.

    Batches: give `train_data` — an iterable of batches (dicts of tensors or numpy arrays) with
    `state_dict()` / `load_state_dict()` for exact resume, such as `TokenLoader` — and the default
    `next_batch` draws from it, starting over when it ends. A trainer that makes its own batches
    overrides `next_batch(model)`: PPO generates rollouts with the current policy there when its
    buffer is empty, and returns one micro-batch per call. Override `state_dict` /
    `load_state_dict` to resume such a position.

    `eval_data`: an iterable that starts over on each `iter()` (a list, a fresh loader), or a
    zero-argument function returning one; `eval_loss` defaults to `loss`.

    `device` is set by the engine before the first batch: move frozen helper models (reference
    policy, reward model) there. One trained module per engine: a policy with a value head is one
    module with two outputs.
    """

    warn_undertrained = False  # pretraining sets this: warn when planned tokens < 20 x parameters
    perplexity = True  # the loss is a mean token NLL, so exp(val_loss) is logged as val_ppl
    pad_id: int | None = None  # padding id of batches without an attention_mask (not counted as tokens)
    device = None

    def __init__(self, model, train_data=None, eval_data=None):
        self.model = model
        self.train_data = train_data
        self.eval_data = eval_data
        self._train_iter = None

    def loss(self, model, batch):
        raise NotImplementedError

    def eval_loss(self, model, batch):
        return self.loss(model, batch)

    def next_batch(self, model):
        if self.train_data is None:
            raise NotImplementedError("give train_data or override next_batch")
        if self._train_iter is None:
            self._train_iter = iter(self.train_data)
        try:
            return next(self._train_iter)
        except StopIteration:  # a finite dataset: next epoch
            self._train_iter = iter(self.train_data)
            return next(self._train_iter)

    def eval_batches(self):
        if self.eval_data is None:
            return None
        return iter(self.eval_data() if callable(self.eval_data) else self.eval_data)

    def batch_tokens(self, batch) -> int:
        """Tokens a batch puts through the model, padding left out, for tokens/s and MFU (given
        the batch as `next_batch` returned it, before it is moved to the device): the ones of its
        `attention_mask`, else its `input_ids` other than `pad_id`, else all of them."""
        if "attention_mask" in batch:
            return int(batch["attention_mask"].sum())  # numpy or torch
        if self.pad_id is not None:
            return int((batch["input_ids"] != self.pad_id).sum())
        return math.prod(batch["input_ids"].shape)

    def items_in_batch(self, batch) -> int | None:
        """What the loss is a mean over, when that is not one micro-batch: the labelled tokens
        of an SFT batch. Given counts, the engine sets `batch[ITEMS_PER_MICRO_BATCH]` on every
        training batch to the optimizer step's count (all its micro-batches, all processes) over
        its number of micro-batches; a loss that divides its item sum by that weighs every item
        of the step alike, however the items fell into micro-batches. None (the default): each
        micro-batch's loss is its own mean. Called on the host batch, as `next_batch` returned it."""
        return None

    def flops_per_token(self) -> float | None:
        """Training FLOPs per token (forward + backward); None = 6 x parameters."""
        return None

    def checkpoint_module(self, module):
        """The part of the trained module written as model.safetensors (default: all of it).
        PPO returns its policy: the value head trains and resumes (DeepSpeed's ds/ shards) but is
        not part of the stage's output checkpoint."""
        return module

    def state_dict(self) -> dict:
        return {"data": self.train_data.state_dict()} if hasattr(self.train_data, "state_dict") else {}

    def load_state_dict(self, state: dict) -> None:
        if "data" in state:
            self.train_data.load_state_dict(state["data"])
        self._train_iter = None


def to_device(batch, device):
    """Tensors and numpy arrays (integers become int64) moved to `device`, nested containers kept."""
    import numpy as np
    import torch

    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    if isinstance(batch, np.ndarray):
        batch = torch.from_numpy(batch.astype(np.int64) if batch.dtype.kind in "iu" else batch)
        if torch.device(device).type == "cuda":
            batch = batch.pin_memory()  # so that the copy below overlaps the running kernels
    if torch.is_tensor(batch):
        return batch.to(device, non_blocking=True)
    return batch
