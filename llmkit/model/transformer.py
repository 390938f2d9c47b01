"""The decoder-only transformer: Llama layout (RoPE, GQA, RMSNorm, SwiGLU) with optional sliding-window
attention and a Mixtral-style mixture of experts (`llmkit.model.mixture_of_experts`, with Qwen3.5-MoE's shared
expert); the deltas of the public families llmkit imports are fields of ModelConfig: an explicit head_dim
(Qwen3, Llama 3.x, Mistral Nemo), q/k/v bias (Qwen2/2.5), q/k norm (Qwen3), RoPE scaling (`llmkit.model.rope`:
linear, dynamic, yarn, longrope, llama3),
layers without RoPE (SmolLM3's NoPE layers), Qwen3.5's gated attention (an output gate, partial rotary,
zero-centred norms) and its Gated DeltaNet layers (`layer_types`: `llmkit.model.gated_deltanet`, a recurrent state where attention keeps a KV cache).

Parameter names and the RoPE layout are those of Hugging Face `LlamaForCausalLM` (`MixtralForCausalLM`
on-disk names for MoE), so `model.state_dict()` loads into transformers as is (`llmkit.hf.mapping`
turns configs and names both ways). Generation with a KV cache lives in `llmkit.model.decoding`.

Callers must know:
- `model(input_ids, position_ids, doc_ids, kv_cache, attention_mask) -> logits [B, T, V]` (float32);
  with `logits_at` (a [B, T] bool mask) only those positions' logits, flat [N, V]: the vocabulary
  projection is skipped where no loss needs it. Trainers call the model (the DeepSpeed engine)
  this way rather than `hidden_states` + `lm_head`: ZeRO-3 gathers and reduces parameters in
  the engine's forward, and a loss computed around it gets wrong gradients.
  `model.hidden_states(...)` returns the final-normed hidden states [B, T, hidden_size].
- `model(..., targets=t, label_smoothing=eps) -> loss`: the mean cross-entropy over the positions
  whose target is not -100 (`t[b, i]` is the token position i predicts: already shifted), computed
  in chunks of positions so the full [B, T, V] logits never exist (`llmkit.model.cross_entropy.chunked_cross_entropy`).
- `doc_ids` [B, T] blocks attention across packed documents; the caller resets `position_ids` per document.
- `attention_mask` [B, past + T] (1 = real token) supports left padding; without `position_ids` the
  positions then count real tokens only.
- Attention kernels: plain causal attention is SDPA's own causal path (FlashAttention on GPU). Packed
  documents, padding and sliding windows need a mask: on CUDA it is a FlexAttention block mask (a
  fused kernel that skips masked blocks; decoding steps after a KV cache keep their small dense mask);
  elsewhere a dense boolean mask for SDPA (torch has no flex backward on CPU). `model.attention_kernel`
  ("auto" | "flex" | "dense", default from the environment variable LLMKIT_ATTENTION) overrides the
  choice; both kernels apply the same `may_attend` rule.
- `model.aux_loss` is the MoE load-balancing loss of the last forward, already times router_aux_loss_coef
  (zero for dense models); add it to the training loss.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from llmkit.model import cpu_kernels
from llmkit.errors import ConfigError
from llmkit.model.gated_deltanet import GatedDeltaNet
from llmkit.model.mixture_of_experts import MixtureOfExperts
from llmkit.model.config import ModelConfig
from llmkit.model.cross_entropy import chunked_cross_entropy
from llmkit.model.packed_linear import grouped_products
from llmkit.model.rope import rope_tables, rotation

try:  # torch >= 2.5
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:
    create_block_mask = flex_attention = None

ATTENTION_KERNELS = ("auto", "flex", "dense")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, zero_centred: bool = False):
        super().__init__()
        self.zero_centred = zero_centred  # the scale is 1 + weight (Qwen3.5), so weight decay pulls it to 1
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centred else torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        weight = 1 + self.weight if self.zero_centred else self.weight
        if cpu_kernels.elementwise(x, weight):
            return cpu_kernels.rms_norm(x, weight, self.eps)
        # normalise in float32 (as transformers does) so bf16 training keeps precision
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * weight


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "layernorm":
        return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=False)  # bias-free: same names as RMSNorm
    return RMSNorm(cfg.hidden_size, cfg.norm_eps, cfg.zero_centred_norm)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rotary(x, cos, sin):
    """x [B, heads, T, D] rotated by position; cos, sin [T, D] or [B, 1, T, D]. Without gradients
    on CPU, in place (x is a projection's fresh output). Narrower tables rotate the first dimensions only."""
    if cos.shape[-1] < x.shape[-1]:  # partial rotary (Qwen3.5)
        return torch.cat([rotary(x[..., :cos.shape[-1]], cos, sin), x[..., cos.shape[-1]:]], dim=-1)
    if cpu_kernels.elementwise(x, cos, sin) and x.stride(-1) == 1:
        return cpu_kernels.rotate_(x, cos, sin)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


def silu_times(gate, up):
    """SwiGLU's silu(gate) * up."""
    if cpu_kernels.elementwise(gate, up) and (product := cpu_kernels.silu_times(gate, up)) is not None:
        return product
    return F.silu(gate) * up


class Attention(nn.Module):
    PRODUCT_GROUPS = {"qkv": ("q_proj", "k_proj", "v_proj")}  # one packed product when decoding

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.output_gate = cfg.attention_output_gate  # q_proj's rows alternate per head: query, gate
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.n_heads * cfg.head_dim * (1 + self.output_gate), bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.qk_norm = cfg.qk_norm
        self.uses_rope = layer_idx not in (cfg.nope_layers or ())  # a NoPE layer (SmolLM3) skips the rotation
        if cfg.qk_norm:
            head_norm = functools.partial(RMSNorm, cfg.head_dim, cfg.norm_eps, cfg.zero_centred_norm)
            self.q_norm, self.k_norm = head_norm(), head_norm()

    def forward(self, x, cos, sin, mask, is_causal, kv_cache):
        B, T, _ = x.shape
        q, k, v = grouped_products(self, "qkv", x)
        if self.output_gate:
            q, gate = q.view(B, T, self.n_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = q.reshape(B, T, self.n_heads, self.head_dim)
        k = k.view(B, T, self.n_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.uses_rope:
            q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer_idx, k, v)
        gqa = self.n_kv_heads != self.n_heads
        dense = mask is None or isinstance(mask, torch.Tensor)
        if kv_cache is not None and dense and cpu_kernels.attends(q, k, v):  # a decoding step on CPU
            key_mask = None if mask is None else mask.expand(B, 1, 1, -1).reshape(B, -1)
            y = cpu_kernels.decode_attention(q, k, v, key_mask).view(B, T, self.n_heads, -1).transpose(1, 2)
        elif dense:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa)
        else:  # a flex BlockMask
            attend = fused_flex_attention() if q.is_cuda else flex_attention
            y = attend(q, k, v, block_mask=mask, enable_gqa=gqa)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(y * torch.sigmoid(gate.reshape(B, T, -1)) if self.output_gate else y)


@functools.cache
def fused_flex_attention():
    # uncompiled, flex_attention materialises the very scores matrix it exists to avoid
    return torch.compile(flex_attention)


def may_attend(past: int, window: int | None, doc_ids, key_mask):
    """The attention rule as a flex mask_mod: (batch, head, query, key) -> True where the query (the
    query-th new token, after `past` cached ones) may attend the key. The dense path calls it on
    broadcast index grids, so both kernels mask the same pairs."""

    def rule(b, h, q, k):
        q = q + past
        allowed = k <= q
        if window is not None:
            allowed = allowed & (q - k < window)
        if doc_ids is not None:
            allowed = allowed & (doc_ids[b, q] == doc_ids[b, k])
        if key_mask is not None:
            allowed = allowed & key_mask[b, k]
        # every query may see itself, so padding rows get a finite (unused) output instead of NaN
        return allowed | (k == q)

    return rule


class MLP(nn.Module):
    """SwiGLU; Mixtral's experts are the same function with w1 = gate, w3 = up, w2 = down."""

    PRODUCT_GROUPS = {"gate_up": ("gate_proj", "up_proj")}  # one packed product when decoding

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        gate, up = grouped_products(self, "gate_up", x)
        return self.down_proj(silu_times(gate, up))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = make_norm(cfg)
        self.is_linear = bool(cfg.layer_types) and cfg.layer_types[layer_idx] == "linear_attention"
        if self.is_linear:  # a Gated DeltaNet mixer (Qwen3.5): a recurrent state instead of keys and values
            self.linear_attn = GatedDeltaNet(cfg, layer_idx)
        else:
            self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = make_norm(cfg)
        self.is_moe = cfg.n_experts > 0
        if self.is_moe:
            self.block_sparse_moe = MixtureOfExperts(cfg)
        else:
            self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, is_causal, kv_cache, token_mask, doc_ids=None):
        h = self.input_layernorm(x)
        x = x + (self.linear_attn(h, token_mask, kv_cache, doc_ids) if self.is_linear
                 else self.self_attn(h, cos, sin, mask, is_causal, kv_cache))
        h = self.post_attention_layernorm(x)
        if self.is_moe:
            h, aux = self.block_sparse_moe(h, token_mask)
            return x + h, aux
        return x + self.mlp(h), None


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(cfg.vocab_size, cfg.hidden_size),
            layers=nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers)),
            norm=make_norm(cfg),
        ))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight  # state_dict then lists both names, as HF does
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.gradient_checkpointing = False  # recompute each block in backward (the engine turns it on)
        self.attention_kernel = os.environ.get("LLMKIT_ATTENTION", "auto")  # see the module docstring
        if self.attention_kernel not in ATTENTION_KERNELS or (self.attention_kernel == "flex" and not flex_attention):
            raise ConfigError(f"LLMKIT_ATTENTION={self.attention_kernel!r}: choose one of "
                              f"{', '.join(ATTENTION_KERNELS)} (flex needs torch >= 2.5)")
        self.loss_chunk_size = 1024  # positions per loss chunk: 1024 x vocab float32 logits (0.5 GB at 128k)
        self.aux_loss = torch.zeros(())
        self.init_weights()

    def init_weights(self, seed: int | None = None):
        """Normal(0, init_std) weights, GPT-2's 1/sqrt(2 * n_layers) on residual projections, unit norms,
        zero biases.
        With a seed the result does not depend on the global RNG. Also rebuilds the RoPE tables, so a
        model materialised from the meta device (to_empty) is complete after this call."""
        cfg = self.config
        device = self.rope_cos.device
        if device.type != "meta":
            self.rope_cos, self.rope_sin = rope_tables(cfg, device)
        generator = None
        if seed is not None and device.type != "meta":
            generator = torch.Generator(device=device).manual_seed(seed)
        residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        residual_projections = ("o_proj.weight", "down_proj.weight", "w2.weight", "out_proj.weight")
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif p.dim() == 1:
                nn.init.ones_(p)
            else:
                std = residual_std if name.endswith(residual_projections) else cfg.init_std
                nn.init.normal_(p, 0.0, std, generator=generator)
        for module in self.modules():  # the parameters whose neutral value is not the loop's
            if isinstance(module, RMSNorm) and module.zero_centred:
                nn.init.zeros_(module.weight)
            elif isinstance(module, GatedDeltaNet):
                module.init_decay(generator)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # parameters() yields a tied matrix once

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 * (parameters used in matmuls) + 12 * L * H * Q * T attention term
        (PaLM appendix B, as nanoGPT's MFU) over the full-attention layers; MoE counts only the top_k
        routed experts."""
        cfg = self.config
        n = self.num_parameters()
        if not cfg.tie_embeddings:
            n -= self.model.embed_tokens.weight.numel()  # a lookup is not a matmul; a tied matrix is the head
        if cfg.n_experts:
            per_expert = 3 * cfg.hidden_size * cfg.intermediate_size
            n -= cfg.n_layers * (cfg.n_experts - cfg.experts_top_k) * per_expert
        context = min(seq_len, cfg.sliding_window or seq_len)
        attending = cfg.n_layers - (cfg.layer_types or []).count("linear_attention")  # a state costs no context term
        return 6 * n + 12 * attending * cfg.n_heads * cfg.head_dim * context

    def forward(self, input_ids, position_ids=None, doc_ids=None, kv_cache=None, attention_mask=None,
                logits_at=None, targets=None, label_smoothing=0.0):
        hidden = self.hidden_states(input_ids, position_ids, doc_ids, kv_cache, attention_mask)
        if targets is not None:
            return chunked_cross_entropy(self.lm_head, hidden, targets, label_smoothing, self.loss_chunk_size)
        if logits_at is not None:
            hidden = hidden[logits_at]
        return self.lm_head(hidden).float()

    def hidden_states(self, input_ids, position_ids=None, doc_ids=None, kv_cache=None, attention_mask=None):
        """Final-normed hidden states [B, T, hidden_size]; arguments as in forward (see module docstring)."""
        cfg = self.config
        B, T = input_ids.shape
        past = kv_cache.length if kv_cache is not None else 0
        if attention_mask is not None and attention_mask.shape != (B, past + T):
            raise ValueError(f"attention_mask must be [batch, cached + new tokens] = {(B, past + T)}, "
                             f"got {tuple(attention_mask.shape)}")
        if doc_ids is not None and past:
            raise ValueError("doc_ids cannot be combined with a filled KV cache")
        if past + T > cfg.max_seq_len:
            raise ValueError(f"sequence of {past + T} tokens exceeds model.max_seq_len={cfg.max_seq_len}")
        if position_ids is None and attention_mask is not None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
        cos, sin = rotation(cfg, self.rope_cos, self.rope_sin, position_ids, past, T)
        mask = self.attention_mask(B, T, past, input_ids.device, doc_ids, attention_mask)
        is_causal = mask is None and past == 0
        token_mask = attention_mask[:, past:] if attention_mask is not None else None

        x = self.model.embed_tokens(input_ids)
        aux_losses = []
        for block in self.model.layers:
            if self.gradient_checkpointing and torch.is_grad_enabled():
                x, aux = checkpoint(block, x, cos, sin, mask, is_causal, kv_cache, token_mask, doc_ids,
                                    use_reentrant=False)
            else:
                x, aux = block(x, cos, sin, mask, is_causal, kv_cache, token_mask, doc_ids)
            if aux is not None:
                aux_losses.append(aux)
        if kv_cache is not None:
            kv_cache.length += T
        self.aux_loss = (cfg.router_aux_loss_coef * torch.stack(aux_losses).mean() if aux_losses
                         else torch.zeros((), device=x.device))
        return self.model.norm(x)

    def attention_mask(self, B, T, past, device, doc_ids, attention_mask):
        """None where SDPA's own causal mask (no cache) or no mask at all (one new token after the cache) is
        exact: the fast path. Otherwise a flex BlockMask or a boolean [B or 1, 1, T, past + T] mask
        (True = may attend), built once per forward for every layer."""
        window = self.config.sliding_window
        windowed = window is not None and past + T > window
        if doc_ids is None and attention_mask is None and not windowed and (past == 0 or T == 1):
            return None
        key_mask = attention_mask.bool() if attention_mask is not None else None
        rule = may_attend(past, window if windowed else None, doc_ids, key_mask)
        per_row = doc_ids is not None or attention_mask is not None
        kernel = self.attention_kernel
        if kernel == "auto":
            # not on CPU: torch refuses flex's backward there, and its forward beats dense SDPA only
            # compiled (1024 tokens, 8 heads, 2 cores: 0.09 s vs 0.12 s, after a 21 s compile per shape)
            kernel = "flex" if device.type == "cuda" and flex_attention is not None else "dense"
        if kernel == "flex" and past == 0:  # a step after the cache (decoding) has few query rows: dense is small
            return create_block_mask(rule, B if per_row else None, None, T, T, device=device)
        b = torch.arange(B if per_row else 1, device=device)[:, None, None, None]
        q = torch.arange(T, device=device)[:, None]
        return rule(b, None, q, torch.arange(past + T, device=device)).expand(b.shape[0], 1, T, past + T)
