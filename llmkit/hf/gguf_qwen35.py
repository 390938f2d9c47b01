"""llama.cpp's `qwen35` layout of a Qwen3.5 language model (Gated DeltaNet layers beside gated full
attention), as convert_hf_to_gguf.py's Qwen3_5TextModel writes it (read in llama.cpp 0c1e57098,
the one llama-cpp-python 0.3.36 vendors), for llmkit.hf.gguf_export:

- keys: `<arch>.ssm.*` for the Gated DeltaNet shape (conv_kernel; state_size = a key head's width;
  group_count = key heads; time_step_rank = value heads; inner_size = all value heads' width),
  `attention.recurrent_layers` (which layers are Gated DeltaNet), full_attention_interval, the
  rotary dimension count (the rotated share of a head) and `rope.dimension_sections` (llama.cpp
  rotates Qwen3.5 with interleaved M-RoPE; a text token has one position in every section, so the
  sections, the converter's default [11, 11, 10, 0], do not change what it computes; see
  `mrope_sections` for heads narrower than their sum);
- tensors: transformers' names mapped by gguf-py (in_proj_qkv -> attn_qkv, in_proj_z -> attn_gate,
  in_proj_b/a -> ssm_beta/ssm_alpha, conv1d -> ssm_conv1d, dt_bias -> ssm_dt.bias, A_log -> ssm_a,
  the gated norm -> ssm_norm, out_proj -> ssm_out, post_attention_layernorm -> post_attention_norm),
  with the converter's changes: A_log stored as -exp(A_log) (llama.cpp multiplies the softplus by
  it), the convolution as [channels, kernel], every zero-centred RMSNorm weight (not the gated
  norm's) as 1 + weight (llama.cpp's RMSNorm multiplies by the weight), and, where there are more
  value heads than key heads, the value heads reordered from grouped by key head to tiled (ggml
  broadcasts the key heads by repeating them whole). q_proj keeps transformers' per-head
  [query, gate] rows: llama.cpp's qwen35 graph splits them so, and rotates halves as transformers
  does (no rotary permutation).

What llama.cpp's qwen35 graph cannot run is refused by name: key and value heads of different
widths in the Gated DeltaNet layers (it sizes both by `ssm.state_size`)."""

from __future__ import annotations

ARCH = "qwen35"
MROPE_SECTIONS = [11, 11, 10, 0]  # convert_hf_to_gguf.py's default when the config names none
FULL_ATTENTION_INTERVAL = 4  # transformers' default; the recurrent_layers key says which layer is which


def qwen35_refusal(cfg) -> str | None:
    """Why llama.cpp's qwen35 graph cannot run the model, or None."""
    if "linear_attention" in (cfg.layer_types or []) and cfg.linear_key_head_dim != cfg.linear_value_head_dim:
        return (f"its Gated DeltaNet key heads are {cfg.linear_key_head_dim} wide and its value heads "
                f"{cfg.linear_value_head_dim}, and llama.cpp's qwen35 architecture sizes both by one key "
                "(ssm.state_size), as every released Qwen3.5 has them")
    return None


def write_qwen35_architecture(writer, cfg) -> None:
    """The keys llama.cpp's qwen35 loader reads beyond those of every architecture."""
    arch = writer.arch
    writer.add_ssm_conv_kernel(cfg.linear_conv_kernel)
    writer.add_ssm_state_size(cfg.linear_key_head_dim)
    writer.add_ssm_group_count(cfg.linear_n_key_heads)
    writer.add_ssm_time_step_rank(cfg.linear_n_value_heads)
    writer.add_ssm_inner_size(cfg.linear_value_head_dim * cfg.linear_n_value_heads)
    types = cfg.layer_types or ["full_attention"] * cfg.n_layers
    # written by key name: gguf-py 0.19 has no add_recurrent_layers (later versions write the same key)
    writer.add_array(f"{arch}.attention.recurrent_layers", [t == "linear_attention" for t in types])
    writer.add_full_attention_interval(FULL_ATTENTION_INTERVAL)
    writer.add_rope_dimension_sections(mrope_sections(cfg))


def mrope_sections(cfg) -> list[int]:
    """The converter's default sections, or where they outnumber a head's dimensions (ggml asserts
    their sum <= head_dim: tiny models), three equal sections covering every rotated pair, so that
    each pair takes the text position (of t, h, w; not the 4th, vision's)."""
    if sum(MROPE_SECTIONS) <= cfg.head_dim:
        return MROPE_SECTIONS
    each = -(-cfg.rotary_dim // 2 // 3)
    return [each, each, each, 0]


def qwen35_tensor(name: str, array, cfg):
    """(the transformers name gguf-py maps, the array as llama.cpp's qwen35 graph reads it) of one
    llmkit tensor (whose names are transformers')."""
    import numpy as np

    if ".linear_attn." in name:
        array = tiled_value_heads(name, array, cfg)
        if name.endswith(".conv1d.weight"):
            array = array.reshape(array.shape[0], array.shape[-1])  # [channels, 1, kernel] -> [channels, kernel]
        elif name.endswith(".A_log"):
            array = -np.exp(array)
        elif name.endswith(".dt_bias"):
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
    if cfg.zero_centred_norm and name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        array = array + 1
    return name, array


def tiled_value_heads(name: str, array, cfg, untile: bool = False):
    """The converter's `_LinearAttentionVReorderBase`: with r value heads per key head, transformers
    groups them by key head (k0v0 … k0v(r-1), k1v0 …), llama.cpp tiles them (k0v0, k1v0, …, k0v1, …);
    reorder every value-head axis (`untile`: back from llama.cpp's order, what import reads)."""
    n_k, n_v = cfg.linear_n_key_heads, cfg.linear_n_value_heads
    if n_k == n_v:
        return array
    per_k, key_dim, v_dim = n_v // n_k, cfg.linear_n_key_heads * cfg.linear_key_head_dim, cfg.linear_value_head_dim
    outer, inner = (per_k, n_k) if untile else (n_k, per_k)  # [outer, inner, d] -> [inner, outer, d]
    if name.endswith((".in_proj_qkv.weight", ".conv1d.weight")):  # only the value rows/channels
        import numpy as np

        return np.concatenate([array[:2 * key_dim], reorder(array[2 * key_dim:], 0, outer, inner, v_dim)])
    if name.endswith(".in_proj_z.weight"):
        return reorder(array, 0, outer, inner, v_dim)
    if name.endswith((".in_proj_a.weight", ".in_proj_b.weight", ".A_log", ".dt_bias")):
        return reorder(array, 0, outer, inner, 1)
    if name.endswith(".out_proj.weight"):
        return reorder(array, 1, outer, inner, v_dim)
    return array


def reorder(array, axis: int, n_k: int, per_k: int, head_dim: int):
    """Heads along `axis` from [n_k, per_k, head_dim] to [per_k, n_k, head_dim]."""
    import numpy as np

    moved = np.moveaxis(array, axis, 0)
    shape = moved.shape
    moved = moved.reshape(n_k, per_k, head_dim, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.ascontiguousarray(np.moveaxis(moved, 0, axis))
