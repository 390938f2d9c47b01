"""Hugging Face interchange of the model: config.json <-> ModelConfig and transformers' weight names
<-> llmkit's (the same names: `Transformer` follows `LlamaForCausalLM`, Qwen2's q/k/v biases, Qwen3's
q_norm / k_norm, and `MixtralForCausalLM`'s on-disk names for MoE; SmolLM3 is Llama's names with
RoPE left out of its `no_rope_layers`; Qwen3.5-MoE's and Qwen3-Next's `mlp.` are our `block_sparse_moe.`
and Qwen3-Next's fused Gated DeltaNet projections are split into Qwen3.5's), for `llmkit export` (to_*)
and `llmkit import` (from_*), for the families of `llmkit.model.config.FAMILIES`."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from llmkit.errors import ConfigError
from llmkit.model.config import FAMILIES, LAYER_TYPES, ROPE_SCALING_KEYS, ModelConfig

if TYPE_CHECKING:
    import torch

    from llmkit.model.transformer import Transformer


def hf_family(cfg: ModelConfig) -> str:
    """The transformers model_type a model exports as: the family it was imported from, else the one
    its features need (NoPE layers: smollm3; q/k norm: qwen3; q/k/v bias: qwen2; experts: mixtral;
    a window: mistral; else llama). A family that cannot express the features is a ConfigError."""
    if cfg.norm != "rmsnorm":
        raise ConfigError("model.norm='layernorm' has no Hugging Face equivalent; export needs rmsnorm")
    family = cfg.family or features_family(cfg)
    hybrid = dict(qk_norm=True, attention_bias=False, sliding_window=None, nope_layers=None,
                  attention_output_gate=True, zero_centred_norm=True)
    needs = {"qwen3": dict(qk_norm=True, attention_bias=False, n_experts=0, nope_layers=None),
             "qwen2": dict(qk_norm=False, attention_bias=True, n_experts=0, nope_layers=None),
             "mixtral": dict(qk_norm=False, attention_bias=False, nope_layers=None),
             "mistral": dict(qk_norm=False, attention_bias=False, n_experts=0, nope_layers=None),
             "llama": dict(qk_norm=False, attention_bias=False, n_experts=0, sliding_window=None, nope_layers=None),
             "smollm3": dict(qk_norm=False, attention_bias=False, n_experts=0, sliding_window=None),
             "qwen3_5_text": dict(hybrid, n_experts=0), "qwen3_5_moe_text": hybrid, "qwen3_next": hybrid}[family]
    if family not in QWEN_HYBRID:  # only Qwen3.5 has these
        needs.update(layer_types=None, rotary_fraction=1.0, attention_output_gate=False, zero_centred_norm=False)
    if family not in QWEN_MOE:  # nor a shared expert
        needs.update(shared_expert_size=0)
    if family == "qwen3_5_moe_text" and not cfg.n_experts:
        raise ConfigError("a qwen3_5_moe_text model needs model.n_experts >= 2")
    wrong = [k for k, v in needs.items() if (getattr(cfg, k) or 0) != (v or 0)]
    if wrong:
        raise ConfigError(f"a {family} model cannot have {', '.join(f'{k}={getattr(cfg, k)}' for k in wrong)}")
    return family


QWEN_HYBRID = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")  # Gated DeltaNet beside gated attention
QWEN_MOE = ("qwen3_5_moe_text", "qwen3_next")  # their experts: Qwen's names, a shared expert beside
MULTIMODAL = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}  # wrapper -> its language model


def features_family(cfg: ModelConfig) -> str:
    qwen3_5 = cfg.layer_types or cfg.attention_output_gate or cfg.zero_centred_norm or cfg.rotary_fraction != 1
    if qwen3_5 and cfg.n_experts:
        return "qwen3_5_moe_text"
    return ("qwen3_5_text" if qwen3_5 else "smollm3" if cfg.nope_layers else "qwen3" if cfg.qk_norm else
            "qwen2" if cfg.attention_bias else "mixtral" if cfg.n_experts else "mistral" if cfg.sliding_window
            else "llama")


def to_hf_config(cfg: ModelConfig) -> dict:
    """config.json for transformers' <Family>ForCausalLM (hf_family), with the RoPE settings in both
    spellings: rope_theta / rope_scaling (transformers 4) and rope_parameters (transformers 5)."""
    family = hf_family(cfg)
    scaling, window = dict(cfg.rope_scaling or {}), cfg.max_seq_len
    if scaling.get("rope_type") == "dynamic":  # transformers' dynamic NTK counts from max_position_embeddings
        window = scaling.pop("original_max_position_embeddings")
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta, **scaling}
    out = dict(
        architectures=[ARCHITECTURES[family]], model_type=family,
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim, hidden_act="silu", max_position_embeddings=window,
        rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, rope_parameters=rope,
        tie_word_embeddings=cfg.tie_embeddings, initializer_range=cfg.init_std,
    )
    if scaling:
        out["rope_scaling"] = scaling
    if family in ("llama", "qwen3", "smollm3"):
        out["attention_bias"] = False
    if family in ("llama", "smollm3"):
        out["mlp_bias"] = False
    if family == "smollm3":  # 1 = the layer uses RoPE, as transformers spells it
        out.update(no_rope_layers=[int(i not in (cfg.nope_layers or ())) for i in range(cfg.n_layers)],
                   use_sliding_window=False, layer_types=["full_attention"] * cfg.n_layers,
                   # SmolLM3Config's defaults are Llama 3's ids, beyond a smaller vocabulary; export writes
                   # the tokenizer's
                   pad_token_id=None, bos_token_id=None, eos_token_id=None)
    if family in ("qwen2", "qwen3"):
        # transformers windows the layers from max_window_layers on; llmkit windows all or none
        out.update(use_sliding_window=cfg.sliding_window is not None, sliding_window=cfg.sliding_window,
                   max_window_layers=0 if cfg.sliding_window else cfg.n_layers)
    elif family in ("mistral", "mixtral"):
        out["sliding_window"] = cfg.sliding_window
    if family in QWEN_HYBRID:
        rope.update(partial_rotary_factor=cfg.rotary_fraction)
        out.update(attention_bias=False, layer_types=cfg.layer_types or ["full_attention"] * cfg.n_layers,
                   linear_num_key_heads=cfg.linear_n_key_heads, linear_num_value_heads=cfg.linear_n_value_heads,
                   linear_key_head_dim=cfg.linear_key_head_dim, linear_value_head_dim=cfg.linear_value_head_dim,
                   linear_conv_kernel_dim=cfg.linear_conv_kernel)
    if cfg.n_experts:
        # transformers' loss is top_k times ours per layer; scale the coefficient so the penalty matches
        out.update(num_local_experts=cfg.n_experts, num_experts_per_tok=cfg.experts_top_k,
                   router_aux_loss_coef=cfg.router_aux_loss_coef / cfg.experts_top_k)
    if family in QWEN_MOE:
        out.update(num_experts=out.pop("num_local_experts", 0), moe_intermediate_size=cfg.intermediate_size,
                   shared_expert_intermediate_size=cfg.shared_expert_size, norm_topk_prob=True,
                   decoder_sparse_step=1, mlp_only_layers=[])
        if family == "qwen3_5_moe_text":  # its config has no dense width, nor Qwen3-Next's layout keys
            for key in ("intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"):
                out.pop(key)
    return out


ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "smollm3": "SmolLM3ForCausalLM",
                 "qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
                 "qwen3_next": "Qwen3NextForCausalLM"}


def from_hf_config(hf: dict) -> ModelConfig:
    """ModelConfig from a transformers config.json of a family llmkit implements (FAMILIES); any
    setting of it that llmkit does not implement is a ConfigError naming it. Qwen3.5's multimodal
    configs (`qwen3_5`, `qwen3_5_moe`) give their language model's (`text_config`): the vision tower
    is left out."""
    if hf.get("model_type") in MULTIMODAL:
        hf = {**(hf.get("text_config") or {}), "model_type": MULTIMODAL[hf["model_type"]]}
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise ConfigError(f"config.json model_type {family!r} is not supported; llmkit implements "
                          f"{', '.join(FAMILIES)}")
    refused = [f"{k}={hf[k]!r}" for k, ok in [("hidden_act", "silu"), ("mlp_bias", False),
                                               ("partial_rotary_factor", 1.0)] if hf.get(k, ok) != ok
               and not (k == "partial_rotary_factor" and family in QWEN_HYBRID)]
    if hf.get("attention_bias") and family != "qwen2":  # Llama / Qwen3's flag also puts a bias on o_proj
        refused.append(f"attention_bias=True ({family} biases o_proj too)")
    if refused:
        raise ConfigError(f"config.json sets {', '.join(refused)}, which llmkit does not implement")
    theta, scaling = read_rope(hf)
    window = hf.get("max_position_embeddings", 2048)
    if scaling and scaling["rope_type"] == "dynamic":  # its reach: the original window times the factor
        window = int(window * scaling["factor"])
    elif scaling and scaling["rope_type"] in ("yarn", "longrope"):  # Qwen2.5's YaRN keeps 32,768 as the window
        window = max(window, int(scaling["original_max_position_embeddings"] * scaling["factor"]))
    shape = dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"], n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim"), intermediate_size=hf.get("moe_intermediate_size") if hf.get("num_experts")
        else hf["intermediate_size"],
        max_seq_len=window, rope_theta=theta, rope_scaling=scaling,
        norm="rmsnorm", norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=hf.get("tie_word_embeddings", family == "smollm3"),  # as each config class defaults
        init_std=hf.get("initializer_range", 0.02), attention_bias=family == "qwen2",
        qk_norm=family == "qwen3", sliding_window=read_sliding_window(hf),
        nope_layers=read_nope_layers(hf) if family == "smollm3" else None,
    )
    if family in QWEN_HYBRID:
        shape.update(read_qwen3_5(hf))
    if family in QWEN_MOE and hf.get("num_experts"):
        shape.update(read_qwen_moe(hf))
    if family == "mixtral":
        top_k = hf.get("num_experts_per_tok", 2)
        shape.update(n_experts=hf["num_local_experts"], experts_top_k=top_k,
                     router_aux_loss_coef=hf.get("router_aux_loss_coef", 0.001) * top_k)  # see to_hf_config
    cfg = ModelConfig(**shape)
    # the family is recorded only where the features would export as another (a Mistral without a
    # window is a Llama in shape), so an llmkit export imports back to the config it came from
    return cfg if features_family(cfg) == family else dataclasses.replace(cfg, family=family)


def read_rope(hf: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from transformers 5's rope_parameters or transformers 4's
    rope_theta + rope_scaling, completed as transformers' standardize_rope_params completes it (the
    original context from max_position_embeddings where the kind needs one and the file has none;
    yarn's and longrope's factor from the two); a scaling type llmkit does not implement is refused by name."""
    rope = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind not in ROPE_SCALING_KEYS:
        raise ConfigError(f"config.json RoPE scaling {kind!r} is not implemented (llmkit implements default, "
                          f"{', '.join(ROPE_SCALING_KEYS)})")
    required, optional = ROPE_SCALING_KEYS[kind]
    scaling = {"rope_type": kind, **{k: rope[k] for k in (*required, *optional) if rope.get(k) is not None}}
    window = hf.get("max_position_embeddings", 2048)
    if kind == "dynamic":  # transformers counts from max_position_embeddings, whatever else the file says
        scaling["original_max_position_embeddings"] = window
    elif kind != "linear":  # Phi3's top-level key first, as transformers
        original = hf.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings")
        scaling["original_max_position_embeddings"] = original or window
    original = scaling.get("original_max_position_embeddings")
    if isinstance(original, float) and original.is_integer():  # a file that writes 32768.0
        scaling["original_max_position_embeddings"] = int(original)
    if kind in ("yarn", "longrope") and scaling.get("factor") is None:
        scaling["factor"] = window / scaling["original_max_position_embeddings"]
    return theta, scaling


def read_qwen3_5(hf: dict) -> dict:
    """Qwen3.5's fields (defaults as Qwen3_5TextConfig's): gated attention with zero-centred q/k norms
    and partial rotary, Gated DeltaNet layers where `layer_types` says (3 of every 4 by default)."""
    n = hf["num_hidden_layers"]
    rope = hf.get("rope_parameters") or {}
    types = hf.get("layer_types") or ["linear_attention" if (i + 1) % hf.get("full_attention_interval", 4)
                                      else "full_attention" for i in range(n)]
    unknown = [f"layer_types[{i}]={t!r}" for i, t in enumerate(types) if t not in LAYER_TYPES]
    if unknown or len(types) != n:
        raise ConfigError(f"config.json {', '.join(unknown) or f'layer_types has {len(types)} entries'}: llmkit "
                          f"implements {' and '.join(LAYER_TYPES)}, one per layer (num_hidden_layers={n})")
    k_heads, v_heads = hf.get("linear_num_key_heads", 16), hf.get("linear_num_value_heads", 32)
    if "linear_attention" in types and (k_heads < 1 or v_heads % k_heads):
        raise ConfigError(f"config.json linear_num_value_heads ({v_heads}) must be a multiple of "
                          f"linear_num_key_heads ({k_heads}): each key head serves a group of value heads")
    return dict(head_dim=hf.get("head_dim", 256), tie_embeddings=hf.get("tie_word_embeddings", False),
                qk_norm=True, attention_output_gate=True, zero_centred_norm=True, layer_types=types,
                rotary_fraction=rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)),
                linear_n_key_heads=k_heads, linear_n_value_heads=v_heads,
                linear_key_head_dim=hf.get("linear_key_head_dim", 128),
                linear_value_head_dim=hf.get("linear_value_head_dim", 128),
                linear_conv_kernel=hf.get("linear_conv_kernel_dim", 4))


def read_qwen_moe(hf: dict) -> dict:
    """Qwen3.5-MoE's and Qwen3-Next's experts (Mixtral's routing, renormalised top-k) and their shared
    expert; a layout llmkit's blocks cannot hold (dense layers among the MoE ones, top-k weights left
    unnormalised) is refused by name."""
    sparse_step, dense = hf.get("decoder_sparse_step", 1), hf.get("mlp_only_layers") or []
    if sparse_step != 1 or dense:
        raise ConfigError(f"config.json has dense MLP layers among the MoE ones (decoder_sparse_step={sparse_step}, "
                          f"mlp_only_layers={dense}); llmkit's blocks are all MoE or all dense")
    if not hf.get("norm_topk_prob", True):
        raise ConfigError("config.json sets norm_topk_prob=False (top-k router weights not renormalised), "
                          "which llmkit does not implement")
    top_k = hf.get("num_experts_per_tok", 8)
    return dict(n_experts=hf["num_experts"], experts_top_k=top_k,
                shared_expert_size=hf.get("shared_expert_intermediate_size", 0),
                router_aux_loss_coef=hf.get("router_aux_loss_coef", 0.001) * top_k)  # see to_hf_config


def read_nope_layers(hf: dict) -> list[int] | None:
    """SmolLM3's layers without RoPE: the 0s of `no_rope_layers` (one flag per layer, 1 = uses RoPE), else
    every `no_rope_layer_interval`-th layer (default 4), as SmolLM3Config derives them."""
    n = hf["num_hidden_layers"]
    flags = hf.get("no_rope_layers")
    if flags is None:
        interval = hf.get("no_rope_layer_interval", 4)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigError(f"config.json no_rope_layer_interval must be a whole number >= 1, got {interval!r}")
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    if len(flags) < n:
        raise ConfigError(f"config.json no_rope_layers has {len(flags)} flags for num_hidden_layers={n}; "
                          "give one per layer (1 = RoPE, 0 = none)")
    return [i for i, uses_rope in enumerate(flags[:n]) if not uses_rope] or None


def read_sliding_window(hf: dict) -> int | None:
    """The attention window of every layer, or None. Qwen2/3 window only with use_sliding_window, and
    then only the layers from max_window_layers on: llmkit windows all layers or none, so a split is
    refused."""
    window = hf.get("sliding_window")
    if hf["model_type"] in ("qwen2", "qwen3"):
        first = hf.get("max_window_layers", hf["num_hidden_layers"])
        if not hf.get("use_sliding_window") or window is None or first >= hf["num_hidden_layers"]:
            return None
        if first > 0:
            raise ConfigError(f"config.json windows attention in layers {first}.. only (use_sliding_window with "
                              f"max_window_layers={first}); llmkit windows every layer or none")
        return window
    if hf["model_type"] == "smollm3":  # transformers windows the layers layer_types names, llmkit all or none
        windowed = "sliding_attention" in (hf.get("layer_types") or [])
        if hf.get("use_sliding_window") and window is not None and windowed:
            raise ConfigError("config.json windows attention in SmolLM3's sliding_attention layers "
                              "(use_sliding_window), which llmkit does not implement")
        return None
    return window if hf["model_type"] != "llama" else None


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Weights as a transformers checkpoint stores them (model.safetensors): our names, minus the tied
    lm_head (save_pretrained drops it too; safetensors refuses shared tensors). Qwen3.5-MoE and
    Qwen3-Next get Qwen's names for the experts, and Qwen3-Next its fused Gated DeltaNet projections."""
    family = hf_family(model.config)
    sd = model.state_dict()
    if model.config.tie_embeddings:
        sd.pop("lm_head.weight")
    if family in QWEN_MOE:
        expert = {v: k for k, v in QWEN_EXPERT.items()}
        sd = {re.sub(r"\.experts\.(\d+)\.(w[123])\.", lambda m: f".experts.{m[1]}.{expert[m[2]]}_proj.",
                     k.replace(".block_sparse_moe.", ".mlp.")): v for k, v in sd.items()}
    if family == "qwen3_next":
        sd = fused_qwen3_next_projections(sd, model.config)
    return {k: v.detach().contiguous() for k, v in sd.items()}


# weights llmkit's model has no place for, which import leaves out: name prefix -> what they are
LEFT_OUT = {"model.visual.": "the vision tower (images and video are not supported)",
            "mtp.": "the multi-token prediction head"}  # both Qwen3.5's


QWEN_EXPERT = {"gate": "w1", "up": "w3", "down": "w2"}


def from_hf_state_dict(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A state_dict for Transformer(cfg).load_state_dict(strict=True) from a transformers checkpoint
    (on-disk names) or a transformers 5 in-memory state_dict (fused Mixtral experts)."""
    out = {}
    for key, value in sd.items():
        if "rotary_emb" in key or key.startswith(tuple(LEFT_OUT)):
            continue
        key = key.replace("model.language_model.", "model.", 1)  # Qwen3.5's multimodal wrapper
        if ".linear_attn.in_proj_qkvz." in key or ".linear_attn.in_proj_ba." in key:
            out.update(split_qwen3_next_projection(key, value, cfg))
            continue
        if cfg.n_experts and ".mlp." in key:
            prefix, rest = key.split(".mlp.")
            moe = f"{prefix}.block_sparse_moe"
            # Qwen's per-expert names (experts.{j}.gate_proj) are Mixtral's w1 / w3 / w2
            rest = re.sub(r"^(experts\.\d+\.)(gate|up|down)_proj\.", lambda m: m[1] + QWEN_EXPERT[m[2]] + ".", rest)
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


def split_qwen3_next_projection(key: str, value: torch.Tensor, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Qwen3-Next's fused Gated DeltaNet projections as Qwen3.5's: `in_proj_qkvz` holds, per key head,
    its q, k rows then its group's v, z rows; `in_proj_ba` per key head its group's b then a rows
    (transformers' fix_query_key_value_ordering). Rows regrouped, values unchanged."""
    import torch

    prefix = key.split(".in_proj_")[0]
    k_dim, group = cfg.linear_key_head_dim, cfg.linear_n_value_heads // cfg.linear_n_key_heads
    fused = 2 * group if ".in_proj_ba." in key else 2 * k_dim + 2 * group * cfg.linear_value_head_dim
    if value.dim() != 2 or value.shape[0] != cfg.linear_n_key_heads * fused:
        return {key: value}  # as it is: the import names it as a tensor that does not fit
    rows = value.view(cfg.linear_n_key_heads, fused, value.shape[-1])
    if ".in_proj_ba." in key:
        b, a = rows.split([group, group], dim=1)
        return {f"{prefix}.in_proj_b.weight": b.reshape(-1, value.shape[-1]),
                f"{prefix}.in_proj_a.weight": a.reshape(-1, value.shape[-1])}
    v_rows = group * cfg.linear_value_head_dim
    q, k, v, z = rows.split([k_dim, k_dim, v_rows, v_rows], dim=1)
    flat = [t.reshape(-1, value.shape[-1]) for t in (q, k, v, z)]
    return {f"{prefix}.in_proj_qkv.weight": torch.cat(flat[:3]), f"{prefix}.in_proj_z.weight": flat[3]}


def fused_qwen3_next_projections(sd: dict, cfg: ModelConfig) -> dict:
    """The inverse of `split_qwen3_next_projection`: Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b and
    in_proj_a of each Gated DeltaNet layer regrouped per key head into in_proj_qkvz and in_proj_ba."""
    import torch

    heads, k_dim = cfg.linear_n_key_heads, cfg.linear_key_head_dim
    v_rows = cfg.linear_n_value_heads // heads * cfg.linear_value_head_dim
    out = {}
    for key, value in sd.items():
        prefix, _, name = key.rpartition(".linear_attn.")
        if name not in ("in_proj_qkv.weight", "in_proj_b.weight"):
            if name not in ("in_proj_z.weight", "in_proj_a.weight"):
                out[key] = value
            continue
        mixer = f"{prefix}.linear_attn"
        if name == "in_proj_qkv.weight":
            q, k, v = value.split([heads * k_dim, heads * k_dim, heads * v_rows])
            parts, fused = (q, k, v, sd[f"{mixer}.in_proj_z.weight"]), f"{mixer}.in_proj_qkvz.weight"
        else:
            parts, fused = (value, sd[f"{mixer}.in_proj_a.weight"]), f"{mixer}.in_proj_ba.weight"
        out[fused] = torch.cat([p.reshape(heads, -1, p.shape[-1]) for p in parts], dim=1).reshape(-1, value.shape[-1])
    return out
