"""The mixture-of-experts feed-forward of `llmkit.model.transformer`'s blocks (`n_experts` >= 2): Mixtral's top-k
routing over SwiGLU experts, and beside them, where `shared_expert_size` > 0, the shared expert of
Qwen3.5-MoE / Qwen3-Next (one more SwiGLU every token passes through, scaled by a sigmoid gate).

Parameter names are Mixtral's on-disk ones (`block_sparse_moe.gate`, `experts.{j}.w1/w2/w3`) and,
for the shared expert, Qwen's (`shared_expert.gate_proj/up_proj/down_proj`, `shared_expert_gate`).
transformers 5 holds experts fused in memory (`mlp.experts.gate_up_proj` [E, 2I, H] = cat(w1, w3),
`mlp.experts.down_proj` [E, H, I] = w2) and converts Mixtral's per-expert names when loading with
from_pretrained, so export writes our names unchanged; `llmkit.hf.mapping.from_hf_state_dict`
undoes the fusion and renames Qwen's `mlp.` to ours.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

if TYPE_CHECKING:
    from llmkit.model.config import ModelConfig


class Expert(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.w3 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SharedExpert(nn.Module):
    """A SwiGLU of its own width that every token passes through (transformers' Qwen3_5MoeMLP)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.shared_expert_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.shared_expert_size, bias=False)
        self.down_proj = nn.Linear(cfg.shared_expert_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MixtureOfExperts(nn.Module):
    """Top-k routing as in Mixtral: softmax over all experts, keep the top k, renormalise their weights
    (Qwen3.5-MoE routes the same way); plus sigmoid(shared_expert_gate(x)) * shared_expert(x) where
    the config has a shared expert."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k = cfg.experts_top_k
        self.gate = nn.Linear(cfg.hidden_size, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(cfg) for _ in range(cfg.n_experts))
        if cfg.shared_expert_size:
            self.shared_expert = SharedExpert(cfg)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x, token_mask=None):
        B, T, H = x.shape
        x = x.reshape(-1, H)
        probs = F.softmax(self.gate(x).float(), dim=-1)  # [N, E]
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)  # [N, k]
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        # group the (token, slot) pairs by expert so each expert runs one matmul over its tokens
        flat_chosen = chosen.flatten()
        order = flat_chosen.argsort()
        counts = torch.bincount(flat_chosen, minlength=len(self.experts))
        token_of = order // self.top_k
        expert_inputs = x[token_of].split(counts.tolist())
        y = torch.cat([expert(part) for expert, part in zip(self.experts, expert_inputs)])
        y = y * weights.flatten()[order, None]
        out = torch.zeros_like(x).index_add_(0, token_of, y)
        if hasattr(self, "shared_expert"):
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.view(B, T, H), self.load_balancing_loss(probs, chosen, token_mask)

    def load_balancing_loss(self, probs, chosen, token_mask):
        """Switch Transformer loss E * sum_e f_e * P_e (1.0 when balanced): f_e = share of the routed
        (token, slot) pairs that go to expert e, P_e = mean router probability of e; padding excluded.
        For one layer it equals transformers' load_balancing_loss_func / top_k."""
        n_experts = probs.shape[-1]
        if token_mask is not None:
            real = token_mask.reshape(-1).bool()
            probs, chosen = probs[real], chosen[real]
        share = torch.bincount(chosen.flatten(), minlength=n_experts).float() / max(chosen.numel(), 1)
        return n_experts * (share * probs.mean(0)).sum()
