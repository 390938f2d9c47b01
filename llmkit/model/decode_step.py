"""One decoding step of a plain decoder on CPU, straight through llmkit's kernels.

At batch 1 a SmolLM2 step's products through int8 weights take ~12 ms of CPU; the modules' calls
around them (30 blocks of `nn.Module.__call__`, the grouped products' checks, splits and views)
took as long again. `step_hidden` runs the same kernels on the same tensors in the same order as
`Transformer.hidden_states` does for one new token (RMSNorm, the q/k/v product, rotary, the KV
cache, one-token attention, o, RMSNorm, gate/up, SwiGLU, down), so its hidden states are those of
the modules bit for bit, with one Python call per kernel. It takes a model whose every layer is
attention with full RoPE (no sliding window, no q/k norm, no output gate), a SwiGLU MLP and RMSNorm,
packed for decoding (`packed_linears`, `decoding_weights`); `plan` says when, else callers keep
`hidden_states`.
"""

from __future__ import annotations

import torch

from llmkit.model import cpu_kernels
from llmkit.model.packed_linear import PACKED, PACKED_FEW, PACKED_GROUPS
from llmkit.model.rope import LENGTH_DEPENDENT


def plan(model, hidden: torch.Tensor) -> list | None:
    """What `step_hidden` reads of each layer, looked up once per generation; None where it cannot run
    `model`'s decoding steps (hidden: the prompt's last hidden states)."""
    from llmkit.model.transformer import RMSNorm

    cfg = model.config
    if (torch.is_grad_enabled() or torch.is_autocast_enabled("cpu") or not cpu_kernels.elementwise(hidden)
            or cfg.layer_types or cfg.n_experts or cfg.sliding_window is not None or cfg.qk_norm
            or cfg.attention_output_gate or cfg.nope_layers
            or (cfg.rope_scaling or {}).get("rope_type") in LENGTH_DEPENDENT
            or model.rope_cos.shape[-1] != cfg.head_dim
            or not cpu_kernels.library().llmkit_attention_takes(cfg.head_dim)):
        return None
    layers = []
    for block in model.model.layers:
        norms = (block.input_layernorm, block.post_attention_layernorm)
        attention, mlp = block.self_attn, block.mlp
        qkv, gate_up = vars(attention).get(PACKED_GROUPS, {}).get("qkv"), vars(mlp).get(PACKED_GROUPS, {}).get("gate_up")
        if (not all(type(n) is RMSNorm and not n.zero_centred for n in norms) or qkv is None or gate_up is None
                or not hasattr(attention.o_proj, PACKED) or not hasattr(mlp.down_proj, PACKED)):
            return None
        o_bias = None if attention.o_proj.bias is None else attention.o_proj.bias.detach()
        layers.append((norms[0].weight, norms[0].eps, qkv, few_rows(attention.o_proj), o_bias, norms[1].weight,
                       norms[1].eps, gate_up, few_rows(mlp.down_proj)))
    final = model.model.norm
    return layers if type(final) is RMSNorm and not final.zero_centred else None


def step_hidden(model, layers: list, input_ids: torch.Tensor, position_ids, kv_cache, attention_mask) -> torch.Tensor:
    """`model.hidden_states(input_ids, position_ids, kv_cache=kv_cache, attention_mask=attention_mask)`
    for input_ids [B, 1], `layers` from `plan` -> [B, 1, hidden_size]."""
    from llmkit.model.transformer import rotation

    cfg = model.config
    B, T = input_ids.shape
    past = kv_cache.length
    if position_ids is None and attention_mask is not None:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
    cos, sin = rotation(cfg, model.rope_cos, model.rope_sin, position_ids, past, T)
    mask = model.attention_mask(B, T, past, input_ids.device, None, attention_mask)
    key_mask = None if mask is None else mask.expand(B, 1, 1, -1).reshape(B, -1)
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    x = model.model.embed_tokens(input_ids)
    for i, (norm1, eps1, qkv, o, o_bias, norm2, eps2, gate_up, down) in enumerate(layers):
        h = cpu_kernels.rms_norm(x, norm1, eps1)
        packed, bias, sizes = qkv
        q, k, v = packed.product(h, bias).split_with_sizes(sizes, -1)
        q = q.reshape(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, Hkv, D).transpose(1, 2)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        cpu_kernels.rotate_(q, cos, sin)
        cpu_kernels.rotate_(k, cos, sin)
        k, v = kv_cache.update(i, k, v)
        x = x + o.product(cpu_kernels.decode_attention(q, k, v, key_mask), o_bias)
        h = cpu_kernels.rms_norm(x, norm2, eps2)
        packed, bias, sizes = gate_up
        gate, up = packed.product(h, bias).split_with_sizes(sizes, -1)
        product = cpu_kernels.silu_times(gate, up)
        if product is None:
            product = torch.nn.functional.silu(gate) * up
        x = x + down.product(product)
    kv_cache.length += T
    norm = model.model.norm
    return cpu_kernels.rms_norm(x, norm.weight, norm.eps)


def few_rows(layer):
    """The packed weight a layer's decoding product goes through, as `packed_linear`'s forward picks it."""
    return getattr(layer, PACKED_FEW, None) or getattr(layer, PACKED)
