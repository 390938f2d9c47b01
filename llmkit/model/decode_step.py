"""One decoding step of a plain decoder on CPU, straight through llmkit's kernels.

At batch 1 a SmolLM2 step's products through int8 weights take ~9 ms of CPU; the modules' calls
around them (30 blocks of `nn.Module.__call__`, the grouped products' checks, splits and views)
took as long again, and one Python call per kernel still ~3 ms. `step_hidden` runs the same
kernels on the same values in the same order as `Transformer.hidden_states` does for one new token
(RMSNorm, the q/k/v product, rotary, the KV cache, one-token attention, o, RMSNorm, gate/up, SwiGLU,
down) in one call for every layer (`llmkit_decode_layers`), so its hidden states are those of the
modules bit for bit. It takes a model whose every layer is attention with full RoPE (no sliding
window, no q/k norm, no output gate), a SwiGLU MLP and RMSNorm, packed for decoding
(`packed_linears`, `decoding_weights`); `plan` says when, else callers keep `hidden_states`.
"""

from __future__ import annotations

import ctypes

import torch

from llmkit.model import cpu_kernels
from llmkit.model.packed_linear import PACKED, PACKED_FEW, PACKED_GROUPS
from llmkit.model.rope import LENGTH_DEPENDENT

K_CACHE, V_CACHE = 14, 15  # the slots of a layer's cache in `DecodeLayer` (cpu_kernels.cpp)


class Plan:
    """What `step_hidden` passes for every layer: its weights' and norms' addresses (the tensors held
    here while they are used) and, filled when the cache's storage changes, its keys' and values'."""

    def __init__(self, model, layers: list[tuple]):
        cfg = model.config
        self.held, rows, eps = [], [], []
        for norm1, eps1, qkv, o, o_bias, norm2, eps2, gate_up, down in layers:
            packed_qkv, qkv_bias, _ = qkv
            packed_gate_up, gate_up_bias, _ = gate_up
            rows.append([self._address(norm1), self._address(norm2), *self._product(packed_qkv, qkv_bias),
                         *self._product(o, o_bias), *self._product(packed_gate_up, gate_up_bias),
                         *self._product(down), 0, 0])
            eps += [eps1, eps2]
        self.table = torch.tensor(rows, dtype=torch.int64)
        self.eps = torch.tensor(eps, dtype=torch.float32)
        self.cache_storage = None
        self.ffn = cfg.intermediate_size

    def _address(self, t: torch.Tensor | None) -> int:
        if t is None:
            return 0
        t = t.detach().float().contiguous()
        self.held.append(t)
        return t.data_ptr()

    def _product(self, weight, bias=None) -> list[int]:
        kernel = ctypes.cast(weight.kernel, ctypes.c_void_p).value
        return [kernel, weight.panels.data_ptr(), self._address(bias)]

    def point_at(self, kv_cache) -> None:
        """The cache's keys and values of every layer in the table (again when their storage has changed:
        rows left the batch, or another generation)."""
        storage = [t.data_ptr() for t in kv_cache.k] + [t.data_ptr() for t in kv_cache.v]
        if storage != self.cache_storage:
            self.table[:, K_CACHE] = torch.tensor(storage[:len(kv_cache.k)], dtype=torch.int64)
            self.table[:, V_CACHE] = torch.tensor(storage[len(kv_cache.k):], dtype=torch.int64)
            self.cache_storage = storage


def plan(model, hidden: torch.Tensor) -> Plan | None:
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
        sizes = (cfg.n_heads * cfg.head_dim, *[cfg.n_kv_heads * cfg.head_dim] * 2)
        if list(qkv[2]) != list(sizes) or list(gate_up[2]) != [cfg.intermediate_size] * 2:
            return None
        layers.append((norms[0].weight, norms[0].eps, qkv, few_rows(attention.o_proj), o_bias, norms[1].weight,
                       norms[1].eps, gate_up, few_rows(mlp.down_proj)))
    final = model.model.norm
    return Plan(model, layers) if type(final) is RMSNorm and not final.zero_centred else None


def step_hidden(model, plan: Plan, input_ids: torch.Tensor, position_ids, kv_cache, attention_mask) -> torch.Tensor:
    """`model.hidden_states(input_ids, position_ids, kv_cache=kv_cache, attention_mask=attention_mask)`
    for input_ids [B, 1] after a prefill (the cache holds every layer), `plan` from `plan` ->
    [B, 1, hidden_size]."""
    from llmkit.model.transformer import rotation

    cfg = model.config
    B, T = input_ids.shape
    past = kv_cache.length
    if kv_cache.shape[2] < past + T:
        raise ValueError(f"KV cache holds {kv_cache.shape[2]} tokens, {past + T} requested")
    if position_ids is None and attention_mask is not None:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
    cos, sin = (t.contiguous() for t in rotation(cfg, model.rope_cos, model.rope_sin, position_ids, past, T))
    mask = model.attention_mask(B, T, past, input_ids.device, None, attention_mask)
    key_mask = None if mask is None else mask.expand(B, 1, 1, -1).reshape(B, -1).to(torch.bool).contiguous()
    H, Hkv, D, hidden = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden_size
    x = model.model.embed_tokens(input_ids).contiguous()
    plan.point_at(kv_cache)
    lib = cpu_kernels.library()
    scratch = torch.empty(lib.llmkit_decode_scratch(B, hidden, H, Hkv, D, plan.ffn), dtype=torch.float32)
    lib.llmkit_decode_layers(plan.table.data_ptr(), plan.eps.data_ptr(), len(plan.table), x.data_ptr(), B, hidden,
                             H, Hkv, D, plan.ffn, past, kv_cache.shape[2], cos.data_ptr(), sin.data_ptr(),
                             0 if cos.dim() == 2 else cos.stride(0), cpu_kernels.address(key_mask), D ** -0.5,
                             scratch.data_ptr(), torch.get_num_threads())
    kv_cache.length += T
    norm = model.model.norm
    return cpu_kernels.rms_norm(x, norm.weight, norm.eps)


def few_rows(layer):
    """The packed weight a layer's decoding product goes through, as `packed_linear`'s forward picks it."""
    return getattr(layer, PACKED_FEW, None) or getattr(layer, PACKED)
