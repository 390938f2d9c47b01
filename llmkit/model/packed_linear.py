"""Linear layers through prepacked weights while a model decodes on CPU, and a frozen base trains.

A decoding step multiplies a few rows (the batch) by every weight matrix. torch's `F.linear` hands
that to MKL's sgemm, which at 16 rows runs SmolLM2's vocabulary projection at ~30 GFLOPS and a
block's products at ~60. A weight laid out once per `packed_linears` for products of few rows
serves any row count from then on: llmkit's panel kernel (`llmkit.model.cpu_kernels`, CPUs with
AVX-512) or, elsewhere, oneDNN's blocked layout (made in 0.2-0.4 s for SmolLM2's 211 matrices).
SmolLM2's 211 products at 16 rows take 33 ms with panels, 44 with oneDNN, 52 with MKL at 2
threads; 60, 74 and 101 ms at 1 (`bench/decode_floor.py`, a Xeon with AVX-512). The results are
those of another summation order (~1e-6 relative), not bit-identical to `F.linear`'s.

Only float32 `nn.Linear` layers on CPU whose weight holds at least MIN_ELEMENTS values are packed:
quantised layers (bitsandbytes' subclasses) and partitioned ZeRO-3 weights are left alone, and
small matrices (LoRA's A and B) gain nothing. The packed copies live only inside the `with`: the
weights may change after it (a trainer's next step). LLMKIT_PACKED_LINEAR=0 turns packing off.

Layers a module multiplies by the same input (a block's q/k/v, the MLP's gate/up: the module's
PRODUCT_GROUPS, computed through `grouped_products`) are packed as one concatenated matrix when
no gradient flows: one longer product per group streams the weights faster than three or two
short ones (30 SmolLM2 blocks at 16 rows, 1 thread, oneDNN: 30 ms instead of 33).

Training packs too, where a weight cannot change: `packed_linears(model, frozen_only=True)`
(the engine, for a run with frozen layers: a LoRA base) packs the frozen layers in both
orientations, so a forward with gradients runs its product through packed W and the input's
gradient through packed Wᵀ, for one more copy of the frozen weights per orientation — only
while the two copies take at most a quarter of the memory available when training starts. Those
copies are oneDNN's (faster at training's many rows); a decoding use inside the run (a rollout)
adds panel copies of them for its few rows while it lasts. With `frozen_dtype=torch.bfloat16`
(`lora.base_products=bf16`) those two copies are bf16 and each product rounds its rows to bf16 and
its sums back to bf16 (as autocast's products do), widened to float32 for the rest: oneDNN's bf16
products take 0.57x the fp32 time of SmolLM2's block shapes at a GRPO step's 3,200 rows on a CPU
with AVX512-BF16, one thread (a relative error of 2.9e-3 a product), while the adapters, norms,
attention, loss and optimizer stay float32.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn as nn

from llmkit.model import cpu_kernels

MIN_ELEMENTS = 65_536  # smaller matrices (LoRA's r x d) run as fast through F.linear
PACKED = "_llmkit_packed_weight"  # the attribute a packed layer carries inside the `with` (a `pack`)
PACKED_T = "_llmkit_packed_transpose"  # and, packed for training, its transpose
PACKED_FEW = "_llmkit_packed_few_rows"  # a training-packed layer's copy for decoding inside the run
PACKED_GROUPS = "_llmkit_packed_groups"  # a module's PRODUCT_GROUPS packed: {group: (packed, bias, sizes)}
TRAINING_SHARE = 0.25  # training packs only if both copies fit in this share of the available memory


def packing_available(model: nn.Module) -> bool:
    """Whether this torch build can pack, packing is on, and the model computes in float32 on CPU."""
    if os.environ.get("LLMKIT_PACKED_LINEAR", "1") == "0" or not (
            torch.backends.mkldnn.is_available() or cpu_kernels.available()):
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
def packed_linears(model: nn.Module, frozen_only: bool = False, frozen_dtype: torch.dtype = torch.float32):
    """Within the `with`, every packable linear layer of `model` multiplies by a packed copy of its
    weight (made on entry, dropped on exit). Nested uses pack once. `frozen_only`: only the layers
    whose weight gets no gradient, packed in both orientations for training (module docstring), in
    `frozen_dtype` (float32, or bfloat16 where the CPU multiplies it: `cpu_precision`)."""
    available = packing_available(model)
    groups = {} if frozen_only or not available else packable_groups(model)
    grouped = {id(layer) for members in groups.values() for layer in members}
    layers = [m for m in model.modules() if packable(m) and not hasattr(m, PACKED) and id(m) not in grouped
              and not (frozen_only and trains(m))] if available else []
    copies = 2 * sum(m.weight.numel() for m in layers) * torch.finfo(frozen_dtype).bits // 8
    if frozen_only and copies > available_memory() * TRAINING_SHARE:
        layers = []  # two more copies of a large frozen base would crowd out the activations
    groups = {key: members for key, members in groups.items()
              if key[1] not in vars(key[0]).get(PACKED_GROUPS, {})}  # not packed yet (by an outer use)
    for (module, name), members in groups.items():
        vars(module).setdefault(PACKED_GROUPS, {})[name] = _packed_concatenation(members)
    for layer in layers:
        weight = layer.weight.detach()
        if frozen_only:
            setattr(layer, PACKED, pack(weight, few_rows=False, dtype=frozen_dtype))
            setattr(layer, PACKED_T, pack(weight.t(), few_rows=False, dtype=frozen_dtype))
        else:
            setattr(layer, PACKED, pack(weight))
        layer.forward = _packed_forward.__get__(layer)
    # decoding inside a run whose frozen layers are packed for training (a GRPO rollout): their
    # few-row products go faster through panels, a third copy held while the decoding lasts
    rollout = [m for m in model.modules() if hasattr(m, PACKED_T) and not hasattr(m, PACKED_FEW)] if (
        not frozen_only and available and cpu_kernels.available()) else []
    if sum(m.weight.nbytes for m in rollout) > available_memory() * TRAINING_SHARE:
        rollout = []
    for layer in rollout:
        setattr(layer, PACKED_FEW, cpu_kernels.PanelWeight(layer.weight))
    try:
        yield
    finally:
        for module, name in groups:
            del getattr(module, PACKED_GROUPS)[name]
        for layer in layers:
            delattr(layer, PACKED)
            if frozen_only:
                delattr(layer, PACKED_T)
            del layer.forward  # the class's forward again
        for layer in rollout:
            delattr(layer, PACKED_FEW)


def packable_groups(model: nn.Module) -> dict[tuple[nn.Module, str], list[nn.Linear]]:
    """(module, group) -> its layers, for every PRODUCT_GROUPS group whose layers are all packable,
    alike in bias and not packed one by one (by an outer use for training)."""
    groups = {}
    for module in model.modules():
        for name, member_names in getattr(module, "PRODUCT_GROUPS", {}).items():
            members = [getattr(module, n) for n in member_names]
            if (all(packable(m) and not hasattr(m, PACKED) for m in members)
                    and len({m.bias is None for m in members}) == 1):
                groups[module, name] = members
    return groups


def pack(weight: torch.Tensor, few_rows: bool = True, dtype: torch.dtype = torch.float32):
    """`weight` [out, in] laid out for products: `.product(x, bias)` is x Wᵀ + bias. For a decoding
    step's few rows, llmkit's panel kernel where it runs; for training's hundreds of rows, oneDNN
    (a SmolLM2 block's products and input gradients at 2,048 rows: 93 ms against 101-115 in panels).
    `dtype` bfloat16: oneDNN's bf16 product of the rows rounded to bf16 (`Bf16OneDNNWeight`)."""
    if dtype == torch.bfloat16:
        return Bf16OneDNNWeight(weight)
    if cpu_kernels.available() and (few_rows or not torch.backends.mkldnn.is_available()):
        return cpu_kernels.PanelWeight(weight)
    return OneDNNWeight(weight)


class OneDNNWeight:
    """oneDNN's blocked layout of a weight (`torch.ops.mkldnn`): training's products, and decoding's
    where the panel kernel cannot run."""

    __slots__ = ("packed",)

    def __init__(self, weight: torch.Tensor):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)

    def product(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


class Bf16OneDNNWeight:
    """A bf16 copy of a weight in oneDNN's blocked layout: `.product(x, bias)` multiplies x rounded to
    bf16 (float32 sums, rounded to bf16: torch's CPU products give no float32 result of bf16 operands)
    and returns float32, the bias added in float32."""

    __slots__ = ("packed",)

    def __init__(self, weight: torch.Tensor):
        bf16 = weight.detach().to(torch.bfloat16).contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(bf16, None)

    def product(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.packed, None, "none", [], "")
        return y.float() if bias is None else y.float() + bias


def _packed_concatenation(layers: list[nn.Linear]) -> tuple:
    weight = torch.cat([m.weight.detach() for m in layers])
    bias = None if layers[0].bias is None else torch.cat([m.bias.detach() for m in layers])
    return pack(weight), bias, [m.out_features for m in layers]


def grouped_products(module: nn.Module, group: str, x) -> tuple:
    """The outputs of the linear layers of `module.PRODUCT_GROUPS[group]` on x: one packed product
    while `packed_linears` holds the group and nothing needs a gradient, else each layer's call."""
    packed = getattr(module, PACKED_GROUPS, {}).get(group)
    members = module.PRODUCT_GROUPS[group]
    if packed is None or torch.is_autocast_enabled("cpu") or (torch.is_grad_enabled() and (
            x.requires_grad or any(trains(getattr(module, n)) for n in members))):
        return tuple(getattr(module, n)(x) for n in members)
    weight, bias, sizes = packed
    return weight.product(x, bias).split(sizes, -1)


def available_memory() -> int:
    """Bytes the kernel could hand out now (MemAvailable), 0 where unknown."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return 0


def trains(layer: nn.Linear) -> bool:
    return layer.weight.requires_grad or (layer.bias is not None and layer.bias.requires_grad)


def _packed_forward(self: nn.Linear, x):
    if torch.is_autocast_enabled("cpu"):
        return nn.Linear.forward(self, x)  # autocast casts per op: let it (the engine's bf16 runs)
    bias = None if self.bias is None else self.bias.detach()
    if torch.is_grad_enabled() and (x.requires_grad or trains(self)):
        transposed = getattr(self, PACKED_T, None)
        if transposed is None or trains(self):
            return nn.Linear.forward(self, x)  # a weight that trains needs its own gradient
        return _FrozenPackedProduct.apply(x, getattr(self, PACKED), transposed, bias)
    return (getattr(self, PACKED_FEW, None) or getattr(self, PACKED)).product(x, bias)


class _FrozenPackedProduct(torch.autograd.Function):
    """x Wᵀ + b for a frozen W and b: the product through packed W, the input's gradient (grad W)
    through packed Wᵀ; nothing is saved of x."""

    @staticmethod
    def forward(ctx, x, packed, packed_transpose, bias):
        ctx.packed_transpose = packed_transpose
        return packed.product(x, bias)

    @staticmethod
    def backward(ctx, grad):
        return ctx.packed_transpose.product(grad.contiguous()), None, None, None
