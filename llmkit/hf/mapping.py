"""Hugging Face interchange of the model: config.json <-> ModelConfig and transformers' weight names
<-> llmkit's (the same names: `Transformer` follows `LlamaForCausalLM`, and `MixtralForCausalLM`'s
on-disk names for MoE), for `llmkit export` (to_*) and `llmkit import` (from_*)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmkit.errors import ConfigError
from llmkit.model import ModelConfig

if TYPE_CHECKING:
    import torch

    from llmkit.model import Transformer


def to_hf_config(cfg: ModelConfig) -> dict:
    """config.json for transformers: LlamaForCausalLM; MistralForCausalLM when a sliding window is set
    (Llama has none; same parameter names); MixtralForCausalLM for MoE."""
    if cfg.norm != "rmsnorm":
        raise ConfigError("model.norm='layernorm' has no Hugging Face Llama equivalent; export needs rmsnorm")
    model_type = "mixtral" if cfg.n_experts else ("mistral" if cfg.sliding_window else "llama")
    out = dict(
        architectures=[f"{model_type.capitalize()}ForCausalLM"], model_type=model_type,
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim, hidden_act="silu", max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,  # rope_theta for transformers 4, parameters for 5
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings, initializer_range=cfg.init_std, attention_bias=False,
    )
    if model_type == "llama":
        out["mlp_bias"] = False
    else:
        out["sliding_window"] = cfg.sliding_window
    if cfg.n_experts:
        # transformers' loss is top_k times ours per layer; scale the coefficient so the penalty matches
        out.update(num_local_experts=cfg.n_experts, num_experts_per_tok=cfg.experts_top_k,
                   router_aux_loss_coef=cfg.router_aux_loss_coef / cfg.experts_top_k)
    return out


def from_hf_config(hf: dict) -> ModelConfig:
    """ModelConfig from a transformers config.json of a llama / mistral / mixtral model."""
    model_type = hf.get("model_type")
    if model_type not in ("llama", "mistral", "mixtral"):
        raise ConfigError(f"config.json model_type {model_type!r} is not supported; "
                          "expected llama, mistral or mixtral")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError(f"config.json rope type {rope.get('rope_type')!r} is not supported (only default RoPE)")
    if hf.get("hidden_act", "silu") != "silu" or hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ConfigError("config.json needs hidden_act=silu and no attention/MLP biases")
    n_heads = hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, hf["hidden_size"] // n_heads):
        raise ConfigError(f"config.json head_dim={hf['head_dim']} differs from hidden_size / num_attention_heads")
    shape = dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        intermediate_size=hf["intermediate_size"], max_seq_len=hf.get("max_position_embeddings", 2048),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))), norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6), tie_embeddings=hf.get("tie_word_embeddings", False),
        init_std=hf.get("initializer_range", 0.02),
    )
    if model_type != "llama":
        shape["sliding_window"] = hf.get("sliding_window")
    if model_type == "mixtral":
        top_k = hf.get("num_experts_per_tok", 2)
        shape.update(n_experts=hf["num_local_experts"], experts_top_k=top_k,
                     router_aux_loss_coef=hf.get("router_aux_loss_coef", 0.001) * top_k)  # see to_hf_config
    return ModelConfig(**shape)


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Weights as a transformers checkpoint stores them (model.safetensors): our names, minus the tied
    lm_head (save_pretrained drops it too; safetensors refuses shared tensors)."""
    if model.config.norm != "rmsnorm":
        raise ConfigError("model.norm='layernorm' has no Hugging Face Llama equivalent; export needs rmsnorm")
    sd = model.state_dict()
    if model.config.tie_embeddings:
        sd.pop("lm_head.weight")
    return {k: v.detach().contiguous() for k, v in sd.items()}


def from_hf_state_dict(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A state_dict for Transformer(cfg).load_state_dict(strict=True) from a transformers checkpoint
    (on-disk names) or a transformers 5 in-memory state_dict (fused Mixtral experts)."""
    out = {}
    for key, value in sd.items():
        if "rotary_emb" in key:
            continue
        if cfg.n_experts and ".mlp." in key:
            prefix, rest = key.split(".mlp.")
            moe = f"{prefix}.block_sparse_moe"
            if rest == "experts.gate_up_proj":
                gate, up = value.chunk(2, dim=1)
                for j in range(cfg.n_experts):
                    out[f"{moe}.experts.{j}.w1.weight"], out[f"{moe}.experts.{j}.w3.weight"] = gate[j], up[j]
            elif rest == "experts.down_proj":
                for j in range(cfg.n_experts):
                    out[f"{moe}.experts.{j}.w2.weight"] = value[j]
            else:
                out[f"{moe}.{rest}"] = value
            continue
        out[key] = value
    if cfg.tie_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out
