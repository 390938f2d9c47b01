"""A frozen base held in 4 or 8 bits (QLoRA, Dettmers et al. 2023) through bitsandbytes.

`lora.quant=nf4|fp4|int8` swaps every linear layer of the decoder blocks for bitsandbytes'
`Linear4bit` / `Linear8bitLt` holding the same weights quantised, before the adapters are
injected: peft then wraps those layers with its own bitsandbytes LoRA layers, as it does for a
transformers model loaded with `BitsAndBytesConfig`. The embedding, the norms and the head stay
as they were (the head is tied to the embedding in small models, and both are lookups or the
loss's input, where 4 bits cost the most accuracy for the least memory). The 4-bit layers
compute in the run's precision (bf16 runs multiply in bf16, fp32 runs in fp32).

A checkpoint keeps the base at full precision (it is the pinned base step folder) and records the
quantisation beside the adapters; loading rebuilds the quantised weights (the quantisation is
deterministic) and merges the adapters into them dequantised (`dequantize_linears`), so
generate, eval and export see the model the adapters were trained on, as plain float weights.
"""

from __future__ import annotations

import ctypes
import functools
import sys

from llmkit.errors import UserError

QUANTS = ("none", "nf4", "fp4", "int8")  # lora.quant: the frozen base's storage
FOUR_BIT = ("nf4", "fp4")
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
UNPOOLED_FROM = 256 * 1024  # bytes: blocks this large get pages of their own, unmapped when freed


def import_bitsandbytes():
    """bitsandbytes, or a UserError saying how to install it."""
    try:
        import bitsandbytes
    except ImportError:
        raise UserError("lora.quant needs the bitsandbytes package: pip install 'bitsandbytes>=0.45' "
                        "(or set lora.quant=none)") from None
    return bitsandbytes


def block_linears(model) -> list[tuple[str, object]]:
    """(name, layer) of every plain `nn.Linear` in the model's decoder blocks."""
    import torch.nn as nn

    return [(name, m) for name, m in model.named_modules()
            if type(m) is nn.Linear and ".layers." in f".{name}"]


def quantize_linears(model, quant: str, double_quant: bool = True, compute_dtype=None) -> int:
    """Replace the block linears of `model` by frozen bitsandbytes layers holding their weights in
    `quant` (nf4 / fp4: 4 bits in blocks of 64 with an absmax each, itself quantised to 8 bits
    when `double_quant`; int8: LLM.int8 rows). Returns the number of layers replaced; marks the
    model as peft expects of a quantised model (`is_loaded_in_4bit` / `is_loaded_in_8bit`)."""
    if quant == "none":
        return 0
    import_bitsandbytes()
    layers = block_linears(model)
    for name, linear in layers:
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, quantized_linear(linear, quant, double_quant, compute_dtype))
    if quant in FOUR_BIT:
        model.is_loaded_in_4bit = True
    else:
        model.is_loaded_in_8bit = True
    return len(layers)


def on_load(lora_cfg, compute_dtype):
    """What `loading.load_model(quantize=)` takes for a run with `lora_cfg`: the block linears
    quantised as the checkpoint is read (as `add_adapters` would quantise them), or None."""
    if not lora_cfg.quantized:
        return None
    return functools.partial(quantize_linears, quant=lora_cfg.quant, double_quant=lora_cfg.double_quant,
                             compute_dtype=compute_dtype)


def unpool_large_allocations(model) -> bool:
    """When `model` holds quantised layers, make glibc give every allocation of UNPOOLED_FROM bytes
    or more pages of its own, returned to the system when freed. Returns whether the setting took
    (glibc on Linux only).

    A quantised layer dequantises its weight into a fresh float buffer in every forward and again
    in backward, and frees it at once. glibc's default threshold rises to the largest block ever
    freed, so after the first step those buffers come from the heap, interleaved with the
    activations kept for backward; the holes they leave stay resident, and a QLoRA step peaked
    ~20% below plain LoRA's, not the ~35% its 4x smaller base allows. Mapping blocks afresh costs
    page faults: at smol-135m 64 KiB doubled a step's CPU time, 256 KiB kept most of its saving
    (loop peak 937-966 MB against 909, LoRA's 1,466) for less, 512 KiB and up lost most of it
    (docs/training.md). Elsewhere (macOS, musl, Windows) there is no mallopt and nothing to do."""
    if not sys.platform.startswith("linux") or not any(is_quantized(m) for m in model.modules()):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # glibc's; another libc may lack it
    except (OSError, AttributeError):
        return False
    return mallopt(M_MMAP_THRESHOLD, UNPOOLED_FROM) == 1


def quantized_linear(linear, quant: str, double_quant: bool, compute_dtype):
    """A frozen bitsandbytes layer with `linear`'s weights (and bias) quantised on its device."""
    import bitsandbytes as bnb
    import torch

    device, weight = linear.weight.device, linear.weight.detach()
    bias = linear.bias is not None
    with torch.device("meta"):  # no throw-away float weight: the quantised one replaces it
        if quant == "int8":
            layer = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=bias,
                                        has_fp16_weights=False, threshold=6.0)
        else:
            layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=bias,
                                      compute_dtype=compute_dtype, compress_statistics=double_quant,
                                      quant_type=quant, quant_storage=torch.uint8)
            # bitsandbytes >= 0.50 re-packs a 4-bit weight for AVX512-BF16 CPUs on its first
            # no-grad eval forward, with the block scales rounded to bf16: evaluation would then
            # compute another model than training did, and a layer narrower than two blocks fails
            layer.support_avx512bf16_for_cpu = False
    if quant == "int8":
        layer.weight = bnb.nn.Int8Params(weight.float().cpu(), requires_grad=False, has_fp16_weights=False)
    else:
        layer.weight = bnb.nn.Params4bit(weight.float().cpu(), requires_grad=False, quant_type=quant,
                                         compress_statistics=double_quant, quant_storage=torch.uint8)
    layer.bias = torch.nn.Parameter(linear.bias.detach().clone(), requires_grad=False) if bias else None
    return layer.to(device if device.type != "meta" else "cpu")  # bitsandbytes quantises on the move


def dequantized_weight(layer):
    """The float32 weight a bitsandbytes layer computes with."""
    import bitsandbytes as bnb
    import torch

    weight = layer.weight
    if isinstance(weight, bnb.nn.Params4bit):
        return bnb.functional.dequantize_4bit(weight.data, weight.quant_state).float()
    scale = weight.SCB if getattr(weight, "SCB", None) is not None else layer.state.SCB
    return weight.data.float() * scale.float()[:, None] / 127.0 if weight.dtype == torch.int8 else weight.float()


def is_quantized(module) -> bool:
    """Whether `module` is one of bitsandbytes' quantised linear layers."""
    name = type(module).__module__ + "." + type(module).__name__
    return name.startswith("bitsandbytes.") and type(module).__name__ in ("Linear4bit", "Linear8bitLt")


def dequantize_linears(model) -> int:
    """Put plain float32 `nn.Linear` layers holding the dequantised weights back in place of
    `model`'s bitsandbytes layers. Returns how many were replaced."""
    import torch.nn as nn

    done = 0
    for name, module in list(model.named_modules()):
        if is_quantized(module):
            linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                               device="meta")
            linear.weight = nn.Parameter(dequantized_weight(module), requires_grad=False)
            if module.bias is not None:
                linear.bias = nn.Parameter(module.bias.detach().float().clone(), requires_grad=False)
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, linear)
            done += 1
    for attr in ("is_loaded_in_4bit", "is_loaded_in_8bit"):
        model.__dict__.pop(attr, None)
    return done


def round_trip(model, quant: str, double_quant: bool = True) -> int:
    """The block linears of a float `model` set to their `quant` values, dequantised: the weights
    adapters trained on a quantised base were trained against, as plain float layers."""
    if quant == "none":
        return 0
    quantize_linears(model, quant, double_quant)
    return dequantize_linears(model)


def frozen_bytes(model) -> dict:
    """Bytes the model's frozen parameters and quantisation statistics take: `quantized` (the
    bitsandbytes layers' packed weights, absmax and codebooks) and `other` (the rest)."""
    packed = {t.data_ptr(): t.numel() * t.element_size()
              for module in model.modules() if is_quantized(module) for t in quant_tensors(module)}
    other = {p.data_ptr(): p.numel() * p.element_size()
             for p in model.parameters() if not p.requires_grad and p.data_ptr() not in packed}
    return {"quantized": sum(packed.values()), "other": sum(other.values())}


def quant_tensors(layer) -> list:
    """The tensors a bitsandbytes layer stores its weight in."""
    weight = layer.weight
    tensors = [weight.data]
    state = getattr(weight, "quant_state", None)
    if state is not None:
        tensors += [state.absmax, state.code]
        if state.nested:
            tensors += [state.state2.absmax, state.state2.code, state.offset]
    for attr in ("SCB",):
        if getattr(weight, attr, None) is not None:
            tensors.append(getattr(weight, attr))
    return tensors
