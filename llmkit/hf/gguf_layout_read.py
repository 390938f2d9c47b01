"""`llmkit import --from FILE.gguf` for the llama.cpp architectures transformers' GGUF reader does not
read and llmkit's export writes: `qwen35` (Qwen3.5's language model) and `smollm3`. The file is read
with gguf-py and every change llmkit.hf.gguf_export (and llama.cpp's convert_hf_to_gguf.py, which
lays these files out the same way) made undone:

- the config: the model's transformers config.json as llmkit wrote it (`llmkit.hf_config`), else
  rebuilt from llama.cpp's keys (`<arch>.block_count`, `attention.*`, `rope.*`, `ssm.*`,
  `attention.recurrent_layers`; SmolLM3 without RoPE in every 4th layer, as llama.cpp's graph
  fixes it; the embedding tied where the file has no `output.weight`);
- the tensors: dequantised by gguf-py (F32, F16, BF16, the 32-value blocks, the K-quants), named
  back to transformers' names, smollm3's q/k rows un-permuted, and qwen35's layout undone (value
  heads untiled, A_log = log(-a), the convolution back to [channels, 1, kernel], zero-centred norms
  less 1, `dt_proj.bias` back to `dt_bias`); a tensor the config needs that the file lacks or holds
  in another shape is a UserError naming both;
- the tokenizer: transformers builds it from the file's vocabulary, merges, special tokens and chat
  template without a config (the tokenizer does not depend on the architecture), with what
  llmkit.hf.gguf_read puts back for every GGUF file, less the `[PAD<id>]` tokens that pad the
  vocabulary to the embedding's rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from llmkit.errors import UserError
from llmkit.hf.gguf_export import LLAMA_CPP_NOPE_STEP, ROTARY_PERMUTED, unpermute_rotary_rows
from llmkit.hf.gguf_qwen35 import tiled_value_heads
from llmkit.hf.gguf_read import LLMKIT_HF_CONFIG_KEY, drop_space_prefix, drop_tokens_beyond, read_gguf_metadata
from llmkit.hf.gguf_tokenizer import UNUSED

LAYOUT_ARCHS = {"qwen35": ("qwen3_5_text", "Qwen3_5ForCausalLM"), "smollm3": ("smollm3", "SmolLM3ForCausalLM")}


class GGUFFile:
    """A GGUF file open for reading: its keys (read when asked: a vocabulary is 150k strings) and tensors."""

    def __init__(self, path: Path):
        import gguf

        self.path = Path(path)
        try:
            self.reader = gguf.GGUFReader(str(self.path))
        except Exception as e:  # a cut file: ValueError, struct.error, IndexError, …
            raise UserError(f"{self.path}: not a readable GGUF file ({type(e).__name__}: {str(e)[:200]}); if it was "
                            "downloaded or copied, check that the file is complete") from None
        self.tensors = {t.name: t for t in self.reader.tensors}

    @property
    def arch(self) -> str:
        return self.get("general.architecture")

    def get(self, key: str, default=None):
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def key(self, name: str):
        """`<arch>.<name>`; a UserError naming it where the file lacks it."""
        value = self.get(f"{self.arch}.{name}")
        if value is None:
            raise UserError(f"{self.path} lacks the key {self.arch}.{name}, which llama.cpp's {self.arch} "
                            f"architecture needs; the file is not one llama.cpp's converter wrote")
        return value


def gguf_architecture(path: Path) -> str | None:
    """The file's `general.architecture`; None where gguf-py cannot read the file (transformers'
    reading then names the damage, as for any GGUF file)."""
    try:
        return GGUFFile(path).arch
    except UserError:
        return None


def transformers_gguf_architectures() -> set[str]:
    """The llama.cpp architectures transformers' GGUF readers know (from 5.x also those whose config
    it rebuilds apart from its older table, qwen35 among them)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        from transformers.integrations.gguf import GGUF_CONFIG_ARCHS
    except ImportError:  # transformers 4
        GGUF_CONFIG_ARCHS = {}
    return set(GGUF_SUPPORTED_ARCHITECTURES) | set(GGUF_CONFIG_ARCHS)


def layout_hf_config(gguf_file: GGUFFile) -> dict:
    """The model's transformers config.json: as llmkit's export wrote it, else from llama.cpp's keys."""
    if (written := gguf_file.get(LLMKIT_HF_CONFIG_KEY)) is not None:
        return json.loads(written)
    return metadata_hf_config(gguf_file)


def metadata_hf_config(f: GGUFFile) -> dict:
    """config.json from llama.cpp's keys, as transformers' config class spells it for the architecture."""
    model_type, architecture = LAYOUT_ARCHS[f.arch]
    if (scaling := f.get(f"{f.arch}.rope.scaling.type", "none")) != "none":
        raise UserError(f"{f.path}: its RoPE scaling ({scaling}) is read only from the llmkit.hf_config key, which "
                        "this file lacks; import the transformers folder it was converted from")
    n_layers = f.key("block_count") - f.get(f"{f.arch}.nextn_predict_layers", 0)  # MTP block counts as a layer
    n_heads = f.key("attention.head_count")
    head_dim = f.get(f"{f.arch}.attention.key_length") or f.key("embedding_length") // n_heads
    theta = float32_value(f.key("rope.freq_base"))
    hf = dict(model_type=model_type, architectures=[architecture], vocab_size=vocab_size(f),
              hidden_size=f.key("embedding_length"), intermediate_size=f.key("feed_forward_length"),
              num_hidden_layers=n_layers, num_attention_heads=n_heads,
              num_key_value_heads=f.get(f"{f.arch}.attention.head_count_kv", n_heads), head_dim=head_dim,
              hidden_act="silu", max_position_embeddings=f.key("context_length"),
              rms_norm_eps=float32_value(f.key("attention.layer_norm_rms_epsilon")), rope_theta=theta,
              rope_parameters={"rope_type": "default", "rope_theta": theta}, attention_bias=False,
              tie_word_embeddings="output.weight" not in f.tensors)  # llama.cpp uses the embedding then
    if f.arch == "smollm3":  # 1 = the layer uses RoPE; llama.cpp's graph leaves it out of every 4th, no key says so
        hf.update(no_rope_layers=[int((i + 1) % LLAMA_CPP_NOPE_STEP != 0) for i in range(n_layers)],
                  use_sliding_window=False, layer_types=["full_attention"] * n_layers, mlp_bias=False)
    else:
        recurrent = f.key("attention.recurrent_layers")[:n_layers]
        value_heads = f.key("ssm.time_step_rank")
        hf["rope_parameters"]["partial_rotary_factor"] = f.key("rope.dimension_count") / head_dim
        hf.update(layer_types=["linear_attention" if r else "full_attention" for r in recurrent],
                  linear_conv_kernel_dim=f.key("ssm.conv_kernel"), linear_key_head_dim=f.key("ssm.state_size"),
                  linear_num_key_heads=f.key("ssm.group_count"), linear_num_value_heads=value_heads,
                  linear_value_head_dim=f.key("ssm.inner_size") // value_heads)
    return hf


def vocab_size(f: GGUFFile) -> int:
    """The embedding's rows (a vocabulary padded to them has as many tokens)."""
    if "token_embd.weight" in f.tensors:
        return int(f.tensors["token_embd.weight"].shape[-1])  # GGUF lists a tensor's axes reversed
    return f.get(f"{f.arch}.vocab_size") or len(f.get("tokenizer.ggml.tokens", []))


def float32_value(value: float) -> float:
    """A key GGUF stored in 32 bits as the shortest decimal that rounds to it: 1e-06, not 9.99999997e-07,
    so that a config read from the keys equals the one llmkit wrote."""
    import numpy as np

    return float(str(np.float32(value)))


def layout_state_dict(f: GGUFFile, cfg, shapes: dict) -> dict:
    """The file's tensors under llmkit's (transformers') names, in transformers' layout, as float32
    torch tensors fitting `shapes` (llmkit's Transformer(cfg) state dict's); a UserError naming a
    tensor the file lacks or holds in another shape. Tensors the model has no place for (Qwen3.5's
    multi-token prediction block) are left out with a note."""
    import gguf
    import torch

    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, f.arch.upper()), cfg.n_layers)
    state_dict, used = {}, set()
    for name, shape in shapes.items():
        if cfg.tie_embeddings and name == "lm_head.weight":
            continue
        gguf_name = names.get_name(gguf_source_name(name, f.arch), try_suffixes=(".weight", ".bias"))
        if gguf_name not in f.tensors:
            raise UserError(f"{f.path} has no tensor {gguf_name} ({name} of the model its keys describe); the file "
                            "is incomplete or not one llama.cpp's converter wrote")
        values = dequantized(f.tensors[gguf_name])
        if values.shape != stored_shape(name, shape):
            raise UserError(f"{f.path}: tensor {gguf_name} is {list(values.shape)} where the file's keys give "
                            f"{list(stored_shape(name, shape))} ({name}); the file's keys and tensors disagree")
        state_dict[name] = torch.from_numpy(transformers_layout(name, gguf_name, values, f.arch, cfg))
        used.add(gguf_name)
    if cfg.tie_embeddings and "lm_head.weight" in shapes:
        state_dict["lm_head.weight"] = state_dict["model.embed_tokens.weight"]
    if left := sorted(set(f.tensors) - used):
        print(f"note: {f.path}: {len(left)} tensors llmkit's model has no place for left out ({', '.join(left[:3])}"
              f"{'…' if len(left) > 3 else ''}); the language model is imported", file=sys.stderr)
    return state_dict


def gguf_source_name(name: str, arch: str) -> str:
    """The transformers name gguf-py maps for `name` (the converter renames Qwen3.5's dt_bias)."""
    if arch == "qwen35" and name.endswith(".linear_attn.dt_bias"):
        return name.removesuffix(".dt_bias") + ".dt_proj.bias"
    return name


def stored_shape(name: str, shape: tuple) -> tuple:
    """How the file holds a tensor of `shape`: Qwen3.5's convolution without its middle axis."""
    return (shape[0], shape[-1]) if name.endswith(".linear_attn.conv1d.weight") else tuple(shape)


def dequantized(tensor):
    """A GGUF tensor's values as a float32 numpy array in PyTorch's axis order (GGUF lists axes reversed)."""
    import gguf
    import numpy as np

    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    # a copy: an F32 tensor's values are a read-only view of the file's memory mapping
    return np.array(values.reshape(tuple(reversed(tensor.shape.tolist()))), dtype=np.float32)


def transformers_layout(name: str, gguf_name: str, values, arch: str, cfg):
    """Undo what export (as llama.cpp's converter) changed of one tensor: llama.cpp's rotary row order
    (llama, smollm3), the qwen35 layout (llmkit.hf.gguf_qwen35, step by step in reverse)."""
    import numpy as np

    if arch in ROTARY_PERMUTED and gguf_name.endswith("attn_q.weight"):
        values = unpermute_rotary_rows(values, cfg.n_heads)
    elif arch in ROTARY_PERMUTED and gguf_name.endswith("attn_k.weight"):
        values = unpermute_rotary_rows(values, cfg.n_kv_heads)
    if arch != "qwen35":
        return np.ascontiguousarray(values)
    if cfg.zero_centred_norm and name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        values = values - 1
    if ".linear_attn." in name:
        if name.endswith(".conv1d.weight"):
            values = values.reshape(values.shape[0], 1, values.shape[-1])
        elif name.endswith(".A_log"):  # stored as -exp(A_log); in float64, so the log adds no rounding of its own
            values = np.log(-values.astype(np.float64)).astype(np.float32)
        values = tiled_value_heads(name, values, cfg, untile=True)
    return np.ascontiguousarray(values)


def save_layout_tokenizer(f: GGUFFile, scratch: Path) -> None:
    """The file's tokenizer (tokenizer.json with its chat template, tokenizer_config.json) in `scratch`.
    transformers' AutoTokenizer first rebuilds the model's config from the file, which it cannot for
    these architectures; its tokenizer class builds the same tokenizer from the vocabulary alone."""
    import transformers

    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(f.path.parent), gguf_file=f.path.name)
    metadata = read_gguf_metadata(f.path)
    drop_space_prefix(metadata, tokenizer)
    drop_tokens_beyond(metadata.get("tokenizer.ggml.tokens", 0), tokenizer)
    drop_padding_tokens(f, tokenizer)
    tokenizer.save_pretrained(scratch)


def drop_padding_tokens(f: GGUFFile, tokenizer) -> None:
    """Remove the unused `[PAD<id>]` tokens that pad a vocabulary to the embedding's rows (llmkit's
    export and llama.cpp's converter write them: llama.cpp needs a token a row), so that the tokenizer
    has the tokens of the one exported; the model's embedding keeps its rows."""
    import re

    from tokenizers import Tokenizer

    tokens, types = f.get("tokenizer.ggml.tokens", []), f.get("tokenizer.ggml.token_type", [])
    padding = {t for t, kind in zip(tokens, types) if kind == UNUSED and re.fullmatch(r"\[PAD\d+\]", t)}
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = spec["model"].get("vocab")
    if not padding or not isinstance(vocab, dict):
        return
    spec["model"]["vocab"] = {t: i for t, i in vocab.items() if t not in padding}
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(spec))
