"""A model's shape as data: `ModelConfig`, the named presets and the Hugging Face families llmkit
implements. Free of torch, so configs, `--dry-run` estimates and `llmkit config` read it without
loading a tensor library; the network itself is `llmkit.model.transformer`.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, fields
from typing import Any

from llmkit.errors import ConfigError


@dataclass
class ModelConfig:
    vocab_size: int = 8192  # tokens in the vocabulary; callers set it from the tokenizer
    hidden_size: int = 384  # width of the residual stream
    n_layers: int = 6  # transformer blocks
    n_heads: int = 6  # query heads; head_dim = hidden_size // n_heads
    n_kv_heads: int = 2  # key/value heads; fewer than n_heads = grouped-query attention
    head_dim: int | None = None  # width of one attention head; None = hidden_size // n_heads
    intermediate_size: int = 1024  # SwiGLU inner width (per expert when n_experts > 0)
    max_seq_len: int = 512  # longest sequence (prompt + generation); RoPE tables are built up to it
    rope_theta: float = 10000.0  # RoPE base frequency
    rope_scaling: dict | None = None  # long-context RoPE: {"rope_type": linear | dynamic | yarn | longrope |
    #                                   llama3, "factor", ...: ROPE_SCALING_KEYS}; None = plain (llmkit.model.rope)
    norm: str = "rmsnorm"  # "rmsnorm" or "layernorm" (layernorm has no HF Llama equivalent: no export)
    norm_eps: float = 1e-5  # epsilon inside every norm
    sliding_window: int | None = None  # a token sees itself and the window-1 tokens before it; None = all
    tie_embeddings: bool = True  # lm_head shares the token embedding matrix
    attention_bias: bool = False  # a bias on the q, k and v projections, none on o (Qwen2 / Qwen2.5)
    qk_norm: bool = False  # RMSNorm over each head of q and of k before RoPE (Qwen3)
    nope_layers: list[int] | None = None  # layers (0-based) whose attention skips RoPE, position coming from
    #                                       the causal mask alone (SmolLM3: every 4th); None = RoPE everywhere
    layer_types: list[str] | None = None  # each layer's mixer: "full_attention" or "linear_attention" (Gated
    #                                       DeltaNet, llmkit.model.gated_deltanet: Qwen3.5's 3 of 4); None = all full
    rotary_fraction: float = 1.0  # share of each head's dimensions RoPE rotates, the rest pass as they are
    #                               (Qwen3.5: 0.25)
    attention_output_gate: bool = False  # q_proj also yields a sigmoid gate per output channel (Qwen3.5)
    zero_centred_norm: bool = False  # every RMSNorm scales by 1 + weight, the weight starting at 0 (Qwen3.5)
    linear_n_key_heads: int = 16  # Gated DeltaNet query/key heads (linear_attention layers only)
    linear_n_value_heads: int = 32  # its value heads: a multiple of linear_n_key_heads
    linear_key_head_dim: int = 128  # width of one query/key head
    linear_value_head_dim: int = 128  # width of one value head
    linear_conv_kernel: int = 4  # taps of the causal depthwise convolution before the delta rule
    n_experts: int = 0  # 0 = dense SwiGLU MLP; >= 2 = top-k mixture of experts in every block
    experts_top_k: int = 2  # experts each token is routed to (MoE only)
    shared_expert_size: int = 0  # inner width of a SwiGLU expert every token passes through, scaled by a
    #                              sigmoid gate (Qwen3.5-MoE, Qwen3-Next); 0 = none (MoE only)
    router_aux_loss_coef: float = 0.01  # weight of the load-balancing loss put in model.aux_loss
    init_std: float = 0.02  # std of the normal init; residual projections get init_std / sqrt(2 * n_layers)
    family: str | None = None  # the Hugging Face model_type `llmkit export` writes (import sets it);
    #                            None = the one the features above need (llmkit.hf.mapping)

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads", "intermediate_size",
                     "max_seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.head_dim is None:
            if self.hidden_size % self.n_heads:
                raise ConfigError(f"model.hidden_size ({self.hidden_size}) must split into n_heads "
                                  f"({self.n_heads}) heads, or set model.head_dim")
            self.head_dim = self.hidden_size // self.n_heads
        if self.head_dim < 2 or self.head_dim % 2:
            raise ConfigError(f"model.head_dim must be even and >= 2 (RoPE rotates pairs), got {self.head_dim}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model.n_heads ({self.n_heads}) must be a multiple of "
                              f"n_kv_heads ({self.n_kv_heads})")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise ConfigError(f"model.norm must be 'rmsnorm' or 'layernorm', got {self.norm!r}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(f"model.sliding_window must be >= 1 or null, got {self.sliding_window}")
        if self.n_experts == 1 or self.n_experts < 0:
            raise ConfigError(f"model.n_experts must be 0 (dense) or >= 2, got {self.n_experts}")
        if self.shared_expert_size < 0 or (self.shared_expert_size and not self.n_experts):
            raise ConfigError(f"model.shared_expert_size must be 0, or >= 1 beside n_experts >= 2, got "
                              f"{self.shared_expert_size} with n_experts={self.n_experts}")
        if self.n_experts and not 1 <= self.experts_top_k <= self.n_experts:
            raise ConfigError(f"model.experts_top_k must be in 1..n_experts ({self.n_experts}), "
                              f"got {self.experts_top_k}")
        if self.rope_theta <= 0 or self.norm_eps <= 0 or self.init_std <= 0 or self.router_aux_loss_coef < 0:
            raise ConfigError("model.rope_theta, norm_eps and init_std must be > 0, router_aux_loss_coef >= 0")
        if self.rope_scaling is not None:
            check_rope_scaling(self.rope_scaling, self.head_dim * self.rotary_fraction)
        if self.nope_layers is not None:
            self.nope_layers = checked_nope_layers(self.nope_layers, self.n_layers)
        if self.layer_types is not None:
            self.layer_types = checked_layer_types(self)
        if not 0 < self.rotary_fraction <= 1 or self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ConfigError(f"model.rotary_fraction ({self.rotary_fraction}) must be in (0, 1] and leave an even "
                              f"number >= 2 of rotated dimensions of head_dim ({self.head_dim})")
        if self.family is not None and self.family not in FAMILIES:
            raise ConfigError(f"model.family {self.family!r} is not one llmkit implements; "
                              f"choose one of {', '.join(FAMILIES)} or null")

    @property
    def rotary_dim(self) -> int:
        """The leading dimensions of each head RoPE rotates."""
        return int(self.head_dim * self.rotary_fraction)


# the Hugging Face families this file implements (llmkit.hf.mapping reads and writes their configs)
FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "smollm3", "qwen3_5_text", "qwen3_5_moe_text",
            "qwen3_next")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# the keys of each RoPE scaling kind, as transformers' modeling_rope_utils reads them: (required, optional)
ROPE_SCALING_KEYS = {
    "linear": (("factor",), ()),
    "dynamic": (("factor", "original_max_position_embeddings"), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "longrope": (("factor", "original_max_position_embeddings", "short_factor", "long_factor"), ("attention_factor",)),
    "llama3": (LLAMA3_ROPE_KEYS, ()),
}


def checked_nope_layers(layers, n_layers: int) -> list[int] | None:
    """Sorted distinct layer indices; None for none (so a config without NoPE layers equals the default)."""
    bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layers]
    if bad or len(set(layers)) != len(layers):
        raise ConfigError(f"model.nope_layers must list distinct layer indices in 0..{n_layers - 1} "
                          f"(n_layers={n_layers}), got {list(layers)}")
    return sorted(layers) or None


LAYER_TYPES = ("full_attention", "linear_attention")  # the mixers a block can hold (model.layer_types)


def checked_layer_types(cfg: ModelConfig) -> list[str] | None:
    """cfg.layer_types checked against n_layers and the Gated DeltaNet shape; None for all full (so a
    config without linear layers equals the default)."""
    types = list(cfg.layer_types)
    unknown = sorted({t for t in types if t not in LAYER_TYPES}, key=str)
    if unknown or len(types) != cfg.n_layers:
        raise ConfigError(f"model.layer_types must name one of {', '.join(LAYER_TYPES)} for each of the "
                          f"{cfg.n_layers} layers, got {len(types)} entries" + (f" with {unknown}" if unknown else ""))
    linear = ("linear_n_key_heads", "linear_n_value_heads", "linear_key_head_dim", "linear_value_head_dim",
              "linear_conv_kernel")
    if "linear_attention" in types and any(getattr(cfg, k) < 1 for k in linear):
        raise ConfigError(f"model.{', '.join(linear)} must be >= 1")
    if "linear_attention" in types and cfg.linear_n_value_heads % cfg.linear_n_key_heads:
        raise ConfigError(f"model.linear_n_value_heads ({cfg.linear_n_value_heads}) must be a multiple of "
                          f"linear_n_key_heads ({cfg.linear_n_key_heads})")
    return types if "linear_attention" in types else None


def check_rope_scaling(scaling, rotary_dim: float | None) -> None:
    """A ConfigError naming the key of `model.rope_scaling` that transformers' RoPE of its kind could not
    use: an unknown kind or key, a required key missing, a factor <= 1 (no scaling), a wrong type
    (longrope's factor lists against rotary_dim, when known)."""
    if not isinstance(scaling, dict):
        raise ConfigError(f"model.rope_scaling must be a mapping such as {{rope_type: yarn, factor: 4, "
                          f"original_max_position_embeddings: 2048}}, or null, got {scaling!r}")
    kind = scaling.get("rope_type")
    if kind not in ROPE_SCALING_KEYS:
        raise ConfigError(f"model.rope_scaling.rope_type {kind!r} is not implemented; choose one of "
                          f"{', '.join(ROPE_SCALING_KEYS)} (rope_scaling null is plain RoPE)")
    required, optional = ROPE_SCALING_KEYS[kind]
    known = ("rope_type", *required, *optional)
    for key in scaling:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; it reads {', '.join(known[1:])}"
            raise ConfigError(f"model.rope_scaling.{key} is not a key of {kind} RoPE scaling{hint}")
    for key in required:
        if scaling.get(key) is None:
            raise ConfigError(f"model.rope_scaling.{key} is required for {kind} RoPE scaling ({kind} needs "
                              f"{', '.join(required)})")
    for key, value in scaling.items():
        if key in ("rope_type", "short_factor", "long_factor") or value is None:
            continue
        wanted = bool if key == "truncate" else int if key == "original_max_position_embeddings" else (int, float)
        if isinstance(value, bool) != (wanted is bool) or not isinstance(value, wanted):
            what = "true or false" if wanted is bool else "a whole number" if wanted is int else "a number"
            raise ConfigError(f"model.rope_scaling.{key} must be {what}, got {value!r}")
    if scaling["factor"] <= 1:
        raise ConfigError(f"model.rope_scaling.factor must be > 1 (how many times the original context the "
                          f"scaling stretches to), got {scaling['factor']}; rope_scaling null is plain RoPE")
    if kind != "linear" and scaling["original_max_position_embeddings"] < 1:
        raise ConfigError("model.rope_scaling.original_max_position_embeddings must be >= 1")
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ConfigError("model.rope_scaling.high_freq_factor must be > low_freq_factor (llama3)")
    if (scaling.get("attention_factor") or 1) <= 0:
        raise ConfigError(f"model.rope_scaling.attention_factor must be > 0, got {scaling['attention_factor']}")
    for key in ("short_factor", "long_factor") if kind == "longrope" else ():
        values, pairs = scaling[key], len(scaling[key]) if rotary_dim is None else int(rotary_dim) // 2
        if (not isinstance(values, list) or len(values) != pairs
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)):
            raise ConfigError(f"model.rope_scaling.{key} must list {pairs} positive numbers (one per "
                              f"rotated pair of a head), got {values!r}")


@dataclass
class ContextExtension:
    """RoPE settings a run changes on the trained model it starts from (`pretrain --from`, `sft`, …:
    `--set model.rope_scaling=…`) to extend its context; None keeps the checkpoint's."""

    rope_scaling: dict[str, Any] | None = None  # e.g. {rope_type: yarn, factor: 4, original_max_position_embeddings:
    #                                             2048} (llmkit.model.rope); None = the checkpoint's
    max_seq_len: int | None = None  # longest sequence after the change; None = the scaling's reach (original x factor)
    rope_theta: float | None = None  # RoPE base frequency; None = the checkpoint's

    def __post_init__(self):
        if self.rope_scaling is not None:  # named now, not when the checkpoint is loaded
            check_rope_scaling(self.rope_scaling, None)


def extended_context(config: ModelConfig, change: ContextExtension) -> ModelConfig:
    """`config` with the RoPE settings of `change`; max_seq_len, unless given, grows to what the new
    scaling reaches (its original context, else the checkpoint's max_seq_len, times its factor)."""
    updates = {k: v for k, v in dataclasses.asdict(change).items() if v is not None}
    if change.rope_scaling is not None:
        updates["max_seq_len"] = extended_max_seq_len(config.max_seq_len, change)
    return dataclasses.replace(config, **updates) if updates else config


def extended_max_seq_len(max_seq_len: int, change: ContextExtension) -> int:
    """The max_seq_len of a checkpoint's model (`max_seq_len` now) after `change` (see extended_context)."""
    scaling = change.rope_scaling
    if change.max_seq_len is not None or scaling is None:
        return change.max_seq_len or max_seq_len
    reach = (scaling.get("original_max_position_embeddings") or max_seq_len) * scaling["factor"]
    return max(max_seq_len, int(reach))


# Shapes only; vocab_size is a placeholder the tokenizer overrides.
PRESETS: dict[str, dict] = {
    "tiny": dict(vocab_size=2048, hidden_size=128, n_layers=4, n_heads=4, n_kv_heads=2, intermediate_size=384,
                 max_seq_len=256),  # ~1M parameters, for tests
    "small": dict(vocab_size=8192, hidden_size=384, n_layers=6, n_heads=6, n_kv_heads=2, intermediate_size=1024,
                  max_seq_len=512),  # ~12.6M, the CPU demo
    "smol-135m": dict(vocab_size=49152, hidden_size=576, n_layers=30, n_heads=9, n_kv_heads=3,
                      intermediate_size=1536, max_seq_len=2048, rope_theta=10000.0),  # SmolLM-135M shapes
    "1b": dict(vocab_size=128256, hidden_size=2048, n_layers=16, n_heads=32, n_kv_heads=8, intermediate_size=8192,
               max_seq_len=2048, rope_theta=500000.0),  # Llama-3.2-1B shapes, without its long-context RoPE
    "3b": dict(vocab_size=32000, hidden_size=2048, n_layers=24, n_heads=32, n_kv_heads=8, intermediate_size=8192,
               max_seq_len=2048, rope_theta=500000.0, tie_embeddings=False, n_experts=16,
               experts_top_k=2),  # the seed config: ~3B active parameters (16 experts, top-2)
}


def model_config(preset: str, **overrides) -> ModelConfig:
    """A named preset with any fields overridden (e.g. vocab_size from the tokenizer)."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    valid = {f.name for f in fields(ModelConfig)}
    for key in overrides:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            raise ConfigError(f"unknown model key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ModelConfig(**{**PRESETS[preset], **overrides})
