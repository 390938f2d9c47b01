"""The Gated DeltaNet mixer: the linear-attention layers of Qwen3.5 / Qwen3.6 (`layer_types`
"linear_attention"), beside the full-attention layers of `llmkit.model.transformer`.

A layer keeps, per value head, a state S [k_head_dim, v_head_dim] that each token decays and
corrects (the gated delta rule, Yang et al. 2024):

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}ᵀ k_t)ᵀ,    o_t = S_tᵀ q_t

with q, k L2-normalised (q also scaled by 1/sqrt(k_head_dim)), beta_t = sigmoid(b_t) how much of
the new value is written and g_t = -exp(A_log) softplus(a_t + dt_bias) <= 0 the log decay. Before
the rule, q, k and v pass a causal depthwise convolution (kernel `linear_conv_kernel`, silu); after
it, each head's output is RMS-normalised and gated by silu(z).

Two forms of one rule: `chunked_gated_delta_rule` (training and prefill: the tokens of a chunk in a
few matrix products, a loop over chunks, so the cost grows linearly with the sequence) and
`recurrent_gated_delta_rule` (decoding: one token at a time from the state). Parameter names are
transformers' `Qwen3_5GatedDeltaNet`'s, so import is a rename.

Callers must know:
- `GatedDeltaNet(cfg, layer_idx)(x, token_mask, cache, doc_ids) -> [B, T, hidden_size]`. `token_mask`
  [B, T] (1 = real) zeroes padding before the projections, as transformers does: a padding token
  then has k = 0 and leaves the state as it found it (decayed), so left padding before a prompt
  leaves the state zero, and right padding only changes what follows the real tokens.
- `doc_ids` [B, T] (packed documents) starts each document from a zero state and a convolution
  that reads nothing before it: a row of documents gives each what it gives alone.
- `cache` is anything with a list `recurrent` indexed by layer (`llmkit.model.decoding.KVCache`): the
  layer reads and replaces its `RecurrentState` there. With a state and one new token the layer
  steps the recurrent form; otherwise it runs the chunked form from the state (zeros without one).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from llmkit.model import cpu_kernels
from llmkit.model.packed_linear import grouped_products

if TYPE_CHECKING:
    from llmkit.model.config import ModelConfig

CHUNK_SIZE = 64  # tokens solved together by the chunked form (transformers' and FLA's default)


@dataclass
class RecurrentState:
    """What a Gated DeltaNet layer carries from one forward to the next while decoding."""

    conv: torch.Tensor  # [B, conv channels, kernel - 1]: the convolution's last inputs (see `steppable`)
    delta: torch.Tensor  # [B, value heads, k_head_dim, v_head_dim], float32: the delta-rule state S

    def select_rows(self, rows: torch.Tensor) -> RecurrentState:
        return RecurrentState(self.conv.transpose(1, 2)[rows].transpose(1, 2), self.delta[rows])

    def placed_in(self, whole: RecurrentState | None, rows: torch.Tensor, batch_size: int) -> RecurrentState:
        """`whole` (the state of batch_size rows; None: zeros) with its rows `rows` set to this state's."""
        if whole is None:
            conv = self.conv.new_zeros(batch_size, self.conv.shape[2], self.conv.shape[1]).transpose(1, 2)
            whole = RecurrentState(conv, self.delta.new_zeros(batch_size, *self.delta.shape[1:]))
        whole.conv[rows], whole.delta[rows] = self.conv, self.delta
        return whole

    def steppable(self) -> RecurrentState:
        """This state laid out for `cpu_kernels.delta_step`, which updates it in place: the conv's
        inputs stored [B, kernel - 1, channels] (one input's channels together: a step reads and rolls
        them as vectors), S contiguous float32. Copies only what is not laid out so already."""
        conv, delta = self.conv, self.delta
        if not conv.transpose(1, 2).is_contiguous():
            conv = conv.transpose(1, 2).contiguous().transpose(1, 2)
        if delta.dtype != torch.float32 or not delta.is_contiguous():
            delta = delta.float().contiguous()
        return self if conv is self.conv and delta is self.delta else RecurrentState(conv, delta)


class GatedRMSNorm(nn.Module):
    """RMSNorm of each head's output, times silu of the gate z (transformers' Qwen3_5RMSNormGated:
    the weight multiplies the normalised value in the input's dtype, the gate in float32)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, gate):
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return (self.weight * normed * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """One linear-attention layer: projections, convolution, delta rule, gated norm, output projection."""

    PRODUCT_GROUPS = {"qkvz": ("in_proj_qkv", "in_proj_z")}  # one packed product when decoding (b, a: too small)

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_k_heads, self.n_v_heads = cfg.linear_n_key_heads, cfg.linear_n_value_heads
        self.k_head_dim, self.v_head_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        key_dim, value_dim = self.n_k_heads * self.k_head_dim, self.n_v_heads * self.v_head_dim
        self.split = (key_dim, key_dim, value_dim)  # q, k, v inside in_proj_qkv's output
        conv_dim = sum(self.split)
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, value_dim, bias=False)  # the output gate
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.n_v_heads, bias=False)  # beta = sigmoid(b)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.n_v_heads, bias=False)  # the decay's input
        # depthwise: each channel its own kernel; applied through `causal_conv`, not the module's forward
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, cfg.linear_conv_kernel, groups=conv_dim, bias=False,
                                padding=cfg.linear_conv_kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.n_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.n_v_heads))
        self.norm = GatedRMSNorm(self.v_head_dim, cfg.norm_eps)
        self.out_proj = nn.Linear(value_dim, cfg.hidden_size, bias=False)

    def init_decay(self, generator=None):
        """transformers' initialisation of what a normal init does not suit: A = exp(A_log) uniform
        in [0.01, 16] (kept away from 0 so log(A) stays finite), dt_bias and the norm's weight ones."""
        with torch.no_grad():
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(0.01, 16, generator=generator).log())
            self.dt_bias.fill_(1.0)
            self.norm.weight.fill_(1.0)

    def forward(self, x, token_mask=None, cache=None, doc_ids=None):
        B, T, _ = x.shape
        if token_mask is not None:
            x = x * token_mask[:, :, None].to(x.dtype)
        qkv, z = grouped_products(self, "qkvz", x)
        b, a = self.in_proj_b(x), self.in_proj_a(x)
        state = cache.recurrent[self.layer_idx] if cache is not None else None
        if state is not None and T == 1 and cpu_kernels.delta_step_takes(x, state.delta, self.v_head_dim):
            # a decoding step on CPU: conv, delta rule and gated norm in one kernel, the states in place
            state = cache.recurrent[self.layer_idx] = state.steppable()
            rows = [t[:, 0] if t.stride(-1) == 1 else t[:, 0].contiguous() for t in (qkv, z, a, b)]
            return self.out_proj(cpu_kernels.delta_step(self, *rows, state.conv, state.delta)[:, None])
        starts = None if doc_ids is None else F.pad(doc_ids[:, 1:] != doc_ids[:, :-1], (1, 0), value=False)
        qkv, conv_state = causal_conv(qkv.transpose(1, 2), self.conv1d.weight, state and state.conv, starts)
        q, k, v = qkv.transpose(1, 2).split(self.split, dim=-1)
        q = q.reshape(B, T, self.n_k_heads, self.k_head_dim)
        k = k.reshape(B, T, self.n_k_heads, self.k_head_dim)
        v = v.reshape(B, T, self.n_v_heads, self.v_head_dim)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)  # float: fp16 A would reach -inf
        rule = recurrent_gated_delta_rule if state is not None and T == 1 else chunked_gated_delta_rule
        y, delta = rule(q, k, v, g, beta, state and state.delta, starts)
        if cache is not None:
            cache.recurrent[self.layer_idx] = RecurrentState(conv_state, delta).steppable()
        y = self.norm(y, z.reshape(B, T, self.n_v_heads, self.v_head_dim))
        return self.out_proj(y.reshape(B, T, -1))


def causal_conv(x, weight, past=None, starts=None):
    """(silu(depthwise causal convolution of x [B, C, T]) [B, C, T], its last kernel - 1 inputs
    [B, C, kernel - 1] for the next step). `past` [B, C, kernel - 1]: the inputs before x; none = zeros
    (the convolution's own padding). `starts` [B, T] (True where a document begins): a tap reaching
    into an earlier document reads zero, as one reaching before the sequence does."""
    B, C, T = x.shape
    kernel = weight.shape[-1]
    if past is None:
        past = x.new_zeros(B, C, kernel - 1)
    window = torch.cat([past.to(x.dtype), x], dim=-1)
    last = window[:, :, window.shape[-1] - (kernel - 1):]
    if starts is None:
        return F.silu(F.conv1d(window, weight, groups=C)), last
    doc = starts.long().cumsum(-1)
    tap_doc = F.pad(doc, (kernel - 1, 0), value=-1)  # the document of each input a tap reads
    taps = (weight[:, 0, i, None] * window[:, :, i:i + T] * (tap_doc[:, None, i:i + T] == doc[:, None])
            for i in range(kernel))
    return F.silu(sum(taps)), last


def l2norm(x, eps: float = 1e-6):
    """x / sqrt(sum(x²) + eps) over the last dimension, FLA's (and transformers') spelling."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def heads_first(q, k, v, g, beta):
    """The rule's inputs as float32 [B, value heads, T, ...], q and k normalised and shared by
    n_v_heads // n_k_heads consecutive value heads (as transformers groups them), q scaled."""
    repeat = v.shape[2] // k.shape[2]
    q, k = (t.repeat_interleave(repeat, dim=2) if repeat > 1 else t for t in (q, k))
    q, k, v, g, beta = (t.transpose(1, 2).float() for t in (q, k, v, g, beta))
    q, k = l2norm(q), l2norm(k)
    return q * q.shape[-1] ** -0.5, k, v, g, beta


def in_float32(rule):
    """`rule` with autocast off, so its products stay float32 under a bf16 / fp16 autocast, as FLA's
    kernels keep them (in bf16 the chunks' triangular systems lose ~0.5% of the output)."""

    @functools.wraps(rule)
    def float32_rule(q, *args, **kwargs):
        with torch.autocast(q.device.type, enabled=False):
            return rule(q, *args, **kwargs)

    return float32_rule


@in_float32
def recurrent_gated_delta_rule(q, k, v, g, beta, state=None, starts=None):
    """(o [B, T, value heads, v_head_dim] in v's dtype, final state [B, value heads, k_head_dim,
    v_head_dim] float32): the rule one token at a time. q, k [B, T, key heads, k_head_dim], v [B, T,
    value heads, v_head_dim], g and beta [B, T, value heads]; state None = zeros; `starts` [B, T]
    (True where a document begins) zeroes the state there."""
    dtype = v.dtype
    q, k, v, g, beta = heads_first(q, k, v, g, beta)
    B, H, T, Dv = v.shape
    S = q.new_zeros(B, H, k.shape[-1], Dv) if state is None else state.float()
    if starts is not None:
        g = g.masked_fill(starts[:, None], float("-inf"))  # exp(-inf) = 0: nothing carries over
    out = []
    for t in range(T):  # products rather than broadcasts and sums: no temporary of S's size
        S = S * g[:, :, t, None, None].exp()
        remembered = (k[:, :, t, None, :] @ S).squeeze(-2)  # what S already gives for k_t
        delta = (v[:, :, t] - remembered) * beta[:, :, t, None]
        S = torch.addcmul(S, k[:, :, t, :, None], delta[:, :, None, :])
        out.append((q[:, :, t, None, :] @ S).squeeze(-2))
    return torch.stack(out, dim=2).transpose(1, 2).to(dtype), S


@in_float32
def chunked_gated_delta_rule(q, k, v, g, beta, state=None, starts=None, chunk_size: int = CHUNK_SIZE):
    """The recurrent rule's results, computed a chunk at a time (arguments and results as
    `recurrent_gated_delta_rule`'s). Inside a chunk the writes form a unit lower-triangular system
    (the WY / UT transform of DeltaNet) solved once; across chunks a loop carries S. A document
    start cuts every decay that spans it (the log decays stay finite, so their differences do)."""
    dtype, T = v.dtype, v.shape[1]
    q, k, v, g, beta = heads_first(q, k, v, g, beta)
    B, H, _, Dv = v.shape
    pad = -T % chunk_size  # padded positions have k = 0 and g = 0: they change nothing
    q, k, v = (F.pad(t, (0, 0, 0, pad)).reshape(B, H, -1, chunk_size, t.shape[-1]) for t in (q, k, v))
    g, beta = (F.pad(t, (0, pad)).reshape(B, H, -1, chunk_size) for t in (g, beta))
    decay = g.cumsum(-1)  # log of the decay from the chunk's start to each position, inclusive
    later = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    # decay between positions j <= i of a chunk, exp(decay_i - decay_j); zero where j > i
    pairwise = (decay[..., :, None] - decay[..., None, :]).masked_fill(later, float("-inf")).exp()
    from_start, to_end = decay.exp(), (decay[..., -1:] - decay).exp()  # chunk start -> i, i -> chunk end
    if starts is not None:  # a document sees nothing written before it began
        begun = F.pad(starts, (0, pad)).reshape(B, 1, -1, chunk_size).long().cumsum(-1)  # starts so far
        pairwise = pairwise * (begun[..., :, None] == begun[..., None, :])
        from_start, to_end = from_start * (begun == 0), to_end * (begun == begun[..., -1:])
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * pairwise  # its diagonal is read as ones
    new_values = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    state_keys = torch.linalg.solve_triangular(system, k_beta * from_start[..., None], upper=False,
                                               unitriangular=True)  # how the state enters the writes
    inside = (q @ k.transpose(-1, -2)) * pairwise  # attention within the chunk
    q_from_start, k_to_end = q * from_start[..., None], k * to_end[..., None]
    chunk_decay = from_start[..., -1, None, None]  # how much of the state passes the whole chunk
    S = q.new_zeros(B, H, k.shape[-1], Dv) if state is None else state.float()
    out = []
    for i in range(q.shape[2]):
        written = new_values[:, :, i] - state_keys[:, :, i] @ S
        out.append(q_from_start[:, :, i] @ S + inside[:, :, i] @ written)
        S = S * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ written
    out = torch.stack(out, dim=2).reshape(B, H, -1, Dv)[:, :, :T]
    return out.transpose(1, 2).to(dtype), S
