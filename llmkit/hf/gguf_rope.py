"""RoPE scaling in a GGUF file, in the keys llama.cpp reads (`<arch>.rope.scaling.*`, gguf-py's
`Keys.Rope`), so that llama.cpp rotates as llmkit and transformers do beyond the original context:
- `linear`: scaling type `linear` and its factor (llama.cpp's freq_scale = 1 / factor);
- `yarn`: type `yarn`, factor, `original_context_length` (the context YaRN's ramp counts rotations
  over), and the attention factor as `attn_factor` relative to YaRN's own 0.1 ln(factor) + 1:
  llama.cpp sets its magnitude scale to that and multiplies it by `attn_factor` (llama_context's
  constructor), so the default writes 1. beta_fast / beta_slow go to `yarn_beta_fast` /
  `yarn_beta_slow` as convert_hf_to_gguf.py writes them, but llama.cpp reads those for a few other
  architectures only: its llama and qwen2 graphs use 32 / 1;
- `llama3`: the `rope_freqs` tensor (llmkit.hf.gguf_export.llama3_rope_factors), no key.
What llama.cpp cannot compute is refused by name: `dynamic` (llama.cpp has no NTK scaling that follows
the sequence length); yarn with other betas than 32 / 1, without truncation (llama.cpp always rounds
the ramp's ends) or with mscale / mscale_all_dim (llama.cpp reads only DeepSeek's variant of them);
`longrope` (not written yet: llama.cpp's rope_factors_long/short tensors)."""

from __future__ import annotations

from llmkit.model.config import ModelConfig


def rope_scaling_refusal(cfg: ModelConfig) -> str | None:
    """Why llama.cpp could not rotate as cfg's RoPE scaling does, or None."""
    s = cfg.rope_scaling or {}
    kind = s.get("rope_type")
    if kind == "dynamic":
        return "its RoPE scaling is dynamic (NTK), which llama.cpp does not implement"
    if kind == "longrope":
        return "its RoPE scaling is longrope, whose factor tensors llmkit's GGUF export does not write yet"
    if kind == "yarn" and ((s.get("beta_fast") or 32) != 32 or (s.get("beta_slow") or 1) != 1):
        return ("its YaRN scaling sets beta_fast / beta_slow, and llama.cpp's llama and qwen2 graphs use 32 / 1 "
                "whatever the file says")
    if kind == "yarn" and not s.get("truncate", True):
        return "its YaRN scaling sets truncate: false, and llama.cpp always rounds the ramp's ends"
    if kind == "yarn" and s.get("attention_factor") is None and (s.get("mscale") or s.get("mscale_all_dim")):
        return "its YaRN scaling sets mscale / mscale_all_dim, which llama.cpp reads for DeepSeek only"
    return None


def write_rope_scaling(writer, cfg: ModelConfig) -> None:
    """cfg's RoPE scaling as `<arch>.rope.scaling.*` keys (nothing for plain RoPE and llama3)."""
    import gguf

    from llmkit.model.rope import yarn_attention_factor, yarn_mscale

    s = cfg.rope_scaling or {}
    if s.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(s["factor"])
    elif s.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(s["factor"])
        writer.add_rope_scaling_orig_ctx_len(s["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_beta_fast(s.get("beta_fast") or 32.0)
        writer.add_rope_scaling_yarn_beta_slow(s.get("beta_slow") or 1.0)
        writer.add_rope_scaling_attn_factors(yarn_attention_factor(s) / yarn_mscale(s["factor"]))
