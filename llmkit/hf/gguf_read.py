"""Reading a GGUF file with transformers (what `llmkit import` and export's probe do), putting
back what transformers' GGUF reader leaves out of llama.cpp's keys:
- the model's config as llmkit wrote it (`llmkit.hf_config`: Llama 3 RoPE scaling, which llama.cpp
  stores as the `rope_freqs` tensor transformers skips; the sliding window; Qwen3's head_dim, which
  transformers does not read and defaults to 128); for other files, head_dim from the
  `attention.key_length` key;
- `tokenizer.ggml.add_space_prefix = false`: transformers always starts a sentencepiece (`llama`)
  text with "▁", llama.cpp does not when the file says so.
The parity probe compares the file, read so, with llmkit's model whose weights are rounded as the
file stores them (llmkit.hf.parity), so that it measures the layout and the metadata, not the
rounding; the logit difference to the unrounded model is recorded beside it."""

from __future__ import annotations

import json
import math
from pathlib import Path

from llmkit.hf.parity import compare_with_transformers, probe_batch

LLMKIT_HF_CONFIG_KEY = "llmkit.hf_config"  # the model's transformers config.json, as llmkit export wrote it
# config.json keys that llmkit's own GGUF files restore from llmkit.hf_config
RESTORED_KEYS = ("model_type", "architectures", "head_dim", "rope_theta", "rope_parameters", "rope_scaling",
                 "sliding_window", "use_sliding_window", "max_window_layers", "max_position_embeddings",
                 "tie_word_embeddings", "rms_norm_eps")


def read_gguf_metadata(path: Path) -> dict:
    """The file's keys; an array (such as the vocabulary) as its length."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out = {}
    for key, field in reader.fields.items():
        array = field.types and field.types[0] == gguf.GGUFValueType.ARRAY
        out[key] = len(field.data) if array else field.contents()
    return out


def load_gguf_with_transformers(path: Path):
    """(AutoModelForCausalLM in float32, eval mode; its tokenizer; the list of what was put back)."""
    import torch
    import transformers

    path = Path(path)
    folder, name = str(path.parent), path.name
    metadata = read_gguf_metadata(path)
    config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name)
    read = config.to_dict()
    overrides = config_overrides(metadata, read)
    fixes = sorted(k for k, v in overrides.items() if not _same(v, read.get(k)))
    # weights load under the model type transformers read (its tensor names come from gguf-py's
    # architecture of that name, and gguf-py has none called "mistral"); a restored family with the
    # same parameter names (Mistral's are Llama's) gets them after
    loading = {**read, **{k: v for k, v in overrides.items() if k not in ("model_type", "architectures")}}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32,
        config=transformers.AutoConfig.for_model(loading.pop("model_type"), **loading))
    if overrides.get("model_type", read["model_type"]) != read["model_type"]:
        final = {**read, **overrides}
        family_model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(final.pop("model_type"), **final), dtype=torch.float32)
        family_model.load_state_dict(model.state_dict(), strict=True)
        model = family_model
    tokenizer, tokenizer_fixes = load_gguf_tokenizer(path, metadata)
    return model.eval(), tokenizer, fixes + tokenizer_fixes


def load_gguf_tokenizer(path: Path, metadata: dict | None = None):
    """(the file's tokenizer as transformers rebuilds it, with what its reader leaves out put
    back; the list of what was put back). Needs no weights: a vocabulary-only file reads too."""
    import transformers

    path = Path(path)
    metadata = read_gguf_metadata(path) if metadata is None else metadata
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    fixes = []
    if drop_space_prefix(metadata, tokenizer):
        fixes.append("add_space_prefix")
    if drop_tokens_beyond(metadata.get("tokenizer.ggml.tokens", 0), tokenizer):
        fixes.append("tokens beyond the vocabulary")
    return tokenizer, fixes


def config_overrides(metadata: dict, read: dict) -> dict:
    """The config.json entries transformers' reading (`read`) may lack, have wrong, or have rounded
    to 32 bits: for llmkit's own files all of RESTORED_KEYS, as llmkit wrote them."""
    if LLMKIT_HF_CONFIG_KEY in metadata:
        written = json.loads(metadata[LLMKIT_HF_CONFIG_KEY])
        return {k: written[k] for k in RESTORED_KEYS if k in written}
    arch = metadata.get("general.architecture")
    head_dim = metadata.get(f"{arch}.attention.key_length")
    return {"head_dim": head_dim} if head_dim and head_dim != read.get("head_dim") else {}


def _same(a, b) -> bool:
    # GGUF stores floats in 32 bits: 1e-5 comes back as 9.99999975e-06
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def drop_space_prefix(metadata: dict, tokenizer) -> bool:
    """Make a sentencepiece tokenizer read from a file with add_space_prefix=false encode and decode
    without the leading "▁"; True when it changed."""
    from tokenizers import decoders, pre_tokenizers

    backend = tokenizer.backend_tokenizer
    if metadata.get("tokenizer.ggml.model") != "llama" or metadata.get("tokenizer.ggml.add_space_prefix", True):
        return False
    if not isinstance(backend.pre_tokenizer, pre_tokenizers.Metaspace) or backend.pre_tokenizer.prepend_scheme == "never":
        return False
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=False)
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.add_prefix_space = False
    return True


def drop_tokens_beyond(n_tokens: int, tokenizer) -> bool:
    """Remove the tokens transformers adds beyond the file's vocabulary (its byte-level reader adds
    GPT-2's `<|endoftext|>` to a vocabulary without one, as Llama 3's is): the model has no
    embedding for them. True when there were any."""
    from tokenizers import Tokenizer

    backend = tokenizer.backend_tokenizer
    if not n_tokens or backend.get_vocab_size(with_added_tokens=True) <= n_tokens:
        return False
    spec = json.loads(backend.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < n_tokens]
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(spec))
    return True


def probe_gguf(path: Path, model, tokenizer, rounded: dict, cfg) -> dict:
    """Read `path` back with transformers and compare it with llmkit's model (its weights rounded as
    the file holds them) and tokenizer; empty when transformers or accelerate is not installed."""
    import importlib.util

    import torch

    missing = [m for m in ("transformers", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"export: {', '.join(missing)} not installed; the GGUF file was not read back")
        return {}
    import transformers

    hf_model, hf_tokenizer, fixes = load_gguf_with_transformers(path)
    inputs = probe_batch(tokenizer, model.config, cfg)
    with torch.no_grad():
        unrounded = (model(inputs) - hf_model(inputs).logits.float()).abs().max().item()
    model.load_state_dict(rounded, strict=False)
    return {**compare_with_transformers(model, tokenizer, hf_model, hf_tokenizer, cfg),
            "max_abs_logit_diff_unrounded": unrounded, "transformers_fixes": fixes,
            "transformers_version": transformers.__version__}
