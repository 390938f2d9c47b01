"""Linear layers through oneDNN's prepacked weights while a model decodes on CPU.

A decoding step multiplies a few rows (the batch) by every weight matrix. torch's `F.linear` hands
that to MKL's sgemm, which at 16 rows runs SmolLM2's vocabulary projection at ~30 GFLOPS and a
block's products at ~60. oneDNN's blocked layout, made once per `packed_linears` (0.2-0.4 s for
SmolLM2's 211 matrices), serves any row count from then on: a 16-row step's products take 31 ms
instead of 69 at 2 threads, 53 instead of 89 at 1 (`bench/decode_floor.py` times both). The
results are those of another summation order (~1e-6 relative), not bit-identical to `F.linear`'s.

Only float32 `nn.Linear` layers on CPU whose weight holds at least MIN_ELEMENTS values are packed:
quantised layers (bitsandbytes' subclasses) and partitioned ZeRO-3 weights are left alone, and
small matrices (LoRA's A and B) gain nothing. The packed copies live only inside the `with`: the
weights may change after it (a trainer's next step). LLMKIT_PACKED_LINEAR=0 turns packing off.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn as nn

MIN_ELEMENTS = 65_536  # smaller matrices (LoRA's r x d) run as fast through F.linear
PACKED = "_llmkit_packed_weight"  # the attribute a packed layer carries inside the `with`


def packing_available(model: nn.Module) -> bool:
    """Whether this torch build can pack, packing is on, and the model computes in float32 on CPU."""
    if os.environ.get("LLMKIT_PACKED_LINEAR", "1") == "0" or not torch.backends.mkldnn.is_available():
        return False
    if torch.is_autocast_enabled("cpu"):
        return False  # autocast casts inputs per op: a packed float32 product would skip that
    weight = next(model.parameters(), None)
    return weight is not None and weight.device.type == "cpu"


def packable(module: nn.Module) -> bool:
    w = getattr(module, "weight", None)
    return (type(module) is nn.Linear and w.dtype == torch.float32 and w.numel() >= MIN_ELEMENTS
            and not hasattr(w, "ds_id"))  # ZeRO-3 holds a partition, gathered only in its own forward


@contextlib.contextmanager
def packed_linears(model: nn.Module):
    """Within the `with`, every packable linear layer of `model` multiplies by a packed copy of its
    weight (made on entry, dropped on exit). Nested uses pack once."""
    layers = [m for m in model.modules() if packable(m) and not hasattr(m, PACKED)] \
        if packing_available(model) else []
    for layer in layers:
        setattr(layer, PACKED, torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), None))
        layer.forward = _packed_forward.__get__(layer)
    try:
        yield
    finally:
        for layer in layers:
            delattr(layer, PACKED)
            del layer.forward  # the class's forward again


def _packed_forward(self: nn.Linear, x):
    if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
        return nn.Linear.forward(self, x)  # the packed product has no backward
    bias = None if self.bias is None else self.bias.detach()
    return torch.ops.mkldnn._linear_pointwise(x, getattr(self, PACKED), bias, "none", [], "")
