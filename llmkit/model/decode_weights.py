"""Decoding through low-precision copies of the weights on CPU (`--set decode.weights=bf16|f16|int8`).

A decoding step at batch 1 reads every weight matrix once for one row, so its time is that of
streaming the weights: float32 is 4 bytes a weight, bf16 2, int8 in GGUF q8_0's blocks 1.06.
`decoding_weights(model, "bf16" | "f16" | "int8")` converts each packable linear layer once (per process:
the copy is kept on the layer while its weight is unchanged) into the panels of
`llmkit.model.cpu_kernels` (`Bf16PanelWeight`: AVX-512, the weights widened to float32 in
registers; `F16PanelWeight`: the same with fp16's 3 more mantissa bits; `Int8PanelWeight`: AVX-512
VNNI, the rows quantised per block of 32 on the fly in two 8-bit parts), all multiplying the rows as
(near) float32 so that only the weights' rounding moves a result away from fp32's, and every
product of the model without a gradient inside the `with` (decoding steps, the prompt's prefill,
eval's and the model judge's scoring) runs through them; the embedding lookup, norms, attention and
the KV cache stay float32.

Where the CPU lacks the instructions, the model is not on CPU or not float32, or
LLMKIT_CPU_KERNELS=fp32 forces it, the model decodes in float32 as without the setting (said once
on stderr), giving float32's tokens.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

from llmkit.errors import ConfigError

WEIGHTS = ("fp32", "bf16", "f16", "int8")
CONVERTED = "_llmkit_decode_weight"  # a layer's (kind, weight version, converted copy), kept between uses
_said: set[str] = set()  # the fallbacks already reported in this process


@dataclass
class DecodeConfig:
    weights: str = "fp32"  # fp32 | bf16 | f16 | int8: the weights CPU decoding multiplies by (bf16, f16: rounded
    #                        to nearest even; int8: q8_0's blocks of 32 with a scale each), converted once

    def __post_init__(self):
        if self.weights not in WEIGHTS:
            raise ConfigError(f"decode.weights must be one of {', '.join(WEIGHTS)}, got {self.weights!r}")


def effective_weights(model, weights: str) -> str:
    """`weights` where this model and CPU can decode through them, else "fp32" (said once)."""
    if weights == "fp32":
        return weights
    import torch

    from llmkit.model import cpu_kernels

    weight = next(model.parameters(), None)
    why = None
    if weight is None or weight.device.type != "cpu" or weight.dtype != torch.float32:
        why = "the model is not float32 on CPU"
    elif os.environ.get("LLMKIT_CPU_KERNELS") in ("0", "fp32"):
        why = f"LLMKIT_CPU_KERNELS={os.environ['LLMKIT_CPU_KERNELS']} is set"
    elif not cpu_kernels.low_precision_available(weights):
        why = (f"this CPU lacks {dict(bf16='AVX-512', f16='AVX-512 and F16C').get(weights, 'AVX-512 VNNI')} "
               "(or llmkit's CPU kernels could not be built here)")
    if why is None:
        return weights
    if why not in _said:
        _said.add(why)
        print(f"llmkit: decode.weights={weights}: {why}; decoding in fp32", file=sys.stderr)
    return "fp32"


@contextlib.contextmanager
def decoding_weights(model, weights: str):
    """Within the `with`, the model's packable linear layers (and product groups: a block's q/k/v,
    the MLP's gate/up) multiply by `weights` copies when no gradient flows; "fp32" (or a fallback,
    `effective_weights`) leaves the model as it is. Layers packed already keep their packing; those
    packed for training (a frozen LoRA base) decode through a `weights` copy for the few rows of a
    rollout, converted once since their weight never changes."""
    import torch

    from llmkit.model import packed_linear as pl

    weights = effective_weights(model, weights)
    if weights == "fp32":
        yield
        return
    groups = pl.packable_groups(model)
    grouped = {id(layer) for members in groups.values() for layer in members}
    layers = [m for m in model.modules() if pl.packable(m) and not hasattr(m, pl.PACKED) and id(m) not in grouped]
    groups = {key: members for key, members in groups.items()
              if key[1] not in vars(key[0]).get(pl.PACKED_GROUPS, {})}
    # packed_linears gives them an fp32 panel copy (PACKED_FEW) for decoding unless one is there
    training_packed = [m for m in model.modules() if hasattr(m, pl.PACKED_T) and not hasattr(m, pl.PACKED_FEW)]
    with torch.no_grad():
        for (module, name), members in groups.items():
            bias = None if members[0].bias is None else torch.cat([m.bias.detach() for m in members])
            packed = converted(module, f"{CONVERTED}_{name}", [m.weight for m in members], weights)
            vars(module).setdefault(pl.PACKED_GROUPS, {})[name] = (packed, bias, [m.out_features for m in members])
        for layer in layers:
            setattr(layer, pl.PACKED, converted(layer, CONVERTED, [layer.weight], weights))
            layer.forward = pl._packed_forward.__get__(layer)
        for layer in training_packed:
            setattr(layer, pl.PACKED_FEW, converted(layer, CONVERTED, [layer.weight], weights))
    try:
        yield
    finally:
        for module, name in groups:
            del getattr(module, pl.PACKED_GROUPS)[name]
        for layer in layers:
            delattr(layer, pl.PACKED)
            del layer.forward  # the class's forward again
        for layer in training_packed:
            delattr(layer, pl.PACKED_FEW)


def converted(owner, attribute: str, parameters: list, weights: str):
    """The `weights` copy of the parameters (concatenated by rows), made once and kept on `owner`
    while every parameter is the same tensor at the same version (an in-place edit makes a new
    copy; a fused optimizer step does not: see `forget_trained_copies`)."""
    import torch

    from llmkit.model import cpu_kernels

    key = (weights, tuple((id(p), p.data_ptr(), p._version) for p in parameters))
    kept = vars(owner).get(attribute)
    if kept is not None and kept[0] == key:
        return kept[1]
    weight = torch.cat([p.detach() for p in parameters]) if len(parameters) > 1 else parameters[0].detach()
    kinds = {"bf16": cpu_kernels.Bf16PanelWeight, "f16": cpu_kernels.F16PanelWeight,
             "int8": cpu_kernels.Int8PanelWeight}
    packed = kinds[weights](weight)
    vars(owner)[attribute] = (key, packed)
    return packed


def forget_trained_copies(model) -> None:
    """Drop the converted copies of every module with a parameter that trains, so that the next
    `decoding_weights` converts them anew: torch's fused AdamW (the engine's) writes a step's
    weights in place without moving a parameter's version counter (torch 2.x), so `converted`
    would hand out the copy of the weights before the step. Copies of frozen layers (a LoRA base)
    are kept."""
    for module in model.modules():
        copies = [name for name in vars(module) if name.startswith(CONVERTED)]
        if copies and any(p.requires_grad for p in module.parameters()):
            for name in copies:
                delattr(module, name)
