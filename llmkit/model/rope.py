"""RoPE's rotation: the inverse frequencies of each scaling kind and the cos/sin a forward rotates by,
computed as transformers 5 computes them (`modeling_rope_utils`, the same float32 operations), so an
imported or exported model's logits equal transformers' beyond its original context.

The kinds (`ModelConfig.rope_scaling["rope_type"]`, keys in `llmkit.model.config.ROPE_SCALING_KEYS`):
- `linear`: every frequency divided by `factor` (position interpolation);
- `dynamic` (NTK): while a forward's sequence (its largest position + 1) is longer than
  `original_max_position_embeddings`, the base grows with that length; within it, plain RoPE;
- `yarn`: low frequencies interpolated, high ones kept, a linear ramp between (beta_fast, beta_slow),
  and cos/sin scaled by the attention factor (0.1 ln(factor) + 1 unless given);
- `longrope`: per-frequency divisors, `long_factor` when a forward's sequence is longer than the
  original context, `short_factor` otherwise, cos/sin scaled by its attention factor;
- `llama3`: Llama 3.1's wavelength bands.

Callers must know: `dynamic` and `longrope` depend on the forward's length, so their cos/sin are
computed per forward (`rotation`) instead of read from the tables; as in transformers, keys already in
a KV cache keep the rotation they were computed with. transformers' `dynamic` also remembers the
longest sequence a module has seen (a shorter forward later, still beyond the original context, reuses
its frequencies); here a forward's rotation depends on that forward alone.
"""

from __future__ import annotations

import math

import torch

from llmkit.model.config import ContextExtension, extended_context

LENGTH_DEPENDENT = ("dynamic", "longrope")  # kinds whose frequencies depend on the forward's length


def inv_frequencies(cfg, seq_len: int | None = None, device=None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rotary_dim / 2] float32, the attention factor cos and sin are scaled by) of
    cfg's RoPE for a forward whose largest position is seq_len - 1 (None: within the original context)."""
    dim, base = cfg.rotary_dim, cfg.rope_theta
    s = cfg.rope_scaling or {"rope_type": "default"}
    kind = s["rope_type"]
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    if kind == "dynamic" and seq_len is not None and seq_len > s["original_max_position_embeddings"]:
        # as transformers: the length is a tensor there, so the new base is computed in float32
        length = torch.tensor(seq_len, device=device)
        base = base * ((s["factor"] * length / s["original_max_position_embeddings"]) - (s["factor"] - 1)) ** (
            dim / (dim - 2))
    inv_freq = 1.0 / (base ** exponents)
    if kind == "linear":
        return inv_freq / s["factor"], 1.0
    if kind == "llama3":
        return llama3_inv_freq(inv_freq, s), 1.0
    if kind == "yarn":
        return yarn_inv_freq(base, exponents, dim, s), yarn_attention_factor(s)
    if kind == "longrope":
        original = s["original_max_position_embeddings"]
        long = seq_len is not None and seq_len > original
        factors = torch.tensor(s["long_factor" if long else "short_factor"], dtype=torch.float32, device=device)
        attention = s.get("attention_factor")
        if attention is None:
            attention = math.sqrt(1 + math.log(s["factor"]) / math.log(original))
        return 1.0 / (factors * base ** exponents), attention
    return inv_freq, 1.0


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's long-context frequencies: wavelengths longer than the original context / low_freq_factor
    are stretched by `factor`, shorter than original / high_freq_factor kept, those between interpolated
    (transformers' _compute_llama3_parameters)."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    stretched = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    between = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(between, (1 - smooth) * stretched / factor + smooth * stretched, stretched)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude scale 0.1 * mscale * ln(scale) + 1 (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(s: dict) -> float:
    """The factor YaRN scales cos and sin by: `attention_factor`, else from mscale / mscale_all_dim, else
    0.1 ln(factor) + 1."""
    if s.get("attention_factor") is not None:
        return s["attention_factor"]
    if s.get("mscale") and s.get("mscale_all_dim"):
        return float(yarn_mscale(s["factor"], s["mscale"]) / yarn_mscale(s["factor"], s["mscale_all_dim"]))
    return yarn_mscale(s["factor"])


def yarn_correction_range(s: dict, dim: int, base: float) -> tuple[float, float]:
    """The rotary pairs (low, high) between which YaRN's ramp runs: pairs below `low` turn more than
    beta_fast times over the original context (kept), above `high` fewer than beta_slow (interpolated)."""
    original = s["original_max_position_embeddings"]

    def pair_of(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = pair_of(s.get("beta_fast") or 32), pair_of(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_inv_freq(base: float, exponents: torch.Tensor, dim: int, s: dict) -> torch.Tensor:
    low, high = yarn_correction_range(s, dim, base)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1).to(exponents.device)
    kept = 1 - ramp  # the share of each pair's original frequency (extrapolation)
    pos_freqs = base ** exponents
    return (1.0 / (s["factor"] * pos_freqs)) * (1 - kept) + (1.0 / pos_freqs) * kept


def rope_tables(cfg, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_seq_len, rotary_dim] in the HF Llama layout (frequencies repeated over both halves),
    times the attention factor; for `dynamic` and `longrope` those of a sequence within the original context."""
    return cos_sin(cfg, torch.arange(cfg.max_seq_len, device=device), None)


def cos_sin(cfg, positions: torch.Tensor, seq_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [*positions.shape, rotary_dim] of `positions` in a forward of seq_len tokens."""
    inv_freq, attention = inv_frequencies(cfg, seq_len, positions.device)
    angles = positions[..., None].float() * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    if attention == 1.0:
        return angles.cos(), angles.sin()
    return angles.cos() * attention, angles.sin() * attention


def rotation(cfg, cos_table, sin_table, position_ids, past: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of one forward's new tokens: [T, D] at past .. past + T - 1, or [B, 1, T, D] at
    position_ids [B, T]; read from the tables but where the kind's frequencies depend on the length
    (`dynamic`, `longrope` beyond the original context), computed for this forward's length (transformers'
    dynamic_rope_update: its largest position + 1)."""
    s = cfg.rope_scaling
    if s is not None and s["rope_type"] in LENGTH_DEPENDENT:
        seq_len = past + T if position_ids is None else int(position_ids.max()) + 1
        if seq_len > s["original_max_position_embeddings"]:
            positions = torch.arange(past, past + T, device=cos_table.device) if position_ids is None else position_ids
            cos, sin = cos_sin(cfg, positions, seq_len)
            return (cos, sin) if position_ids is None else (cos.unsqueeze(1), sin.unsqueeze(1))
    if position_ids is None:
        return cos_table[past:past + T], sin_table[past:past + T]
    return cos_table[position_ids].unsqueeze(1), sin_table[position_ids].unsqueeze(1)


def extend_context(model, change: ContextExtension):
    """`model` (a Transformer) with the RoPE settings of `change` (model.config and the tables): the
    weights stay, a longer context is what a run starting from them trains on."""
    config = extended_context(model.config, change)
    if config != model.config:
        model.config = config
        model.rope_cos, model.rope_sin = rope_tables(config, model.rope_cos.device)
    return model
