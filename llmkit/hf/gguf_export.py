"""`llmkit export --format gguf`: a checkpoint -> one GGUF file for llama.cpp / Ollama, written with
the `gguf` package's pure-Python writer and quantisers, laid out as llama.cpp's
convert_hf_to_gguf.py lays out the same model: its architecture (`llama` for Llama 3, SmolLM2,
Mistral and llmkit's own models; `qwen2`; `qwen3`; `smollm3`; `qwen35` for Qwen3.5's language model,
its Gated DeltaNet layers and gated attention as llmkit.hf.gguf_qwen35 lays them out), tensor names (`blk.N.attn_q.weight`,
…), the q/k rows of `llama` and `smollm3` models permuted to llama.cpp's rotary layout, Llama 3 RoPE
scaling as the `rope_freqs` tensor, linear and YaRN scaling as keys (llmkit.hf.gguf_rope), and the
tokenizer (llmkit.hf.gguf_tokenizer). A LoRA checkpoint is merged.

Quantisation (`quant`): f16 / bf16 store every matrix in that type; q8_0, q4_0, q4_1 quantise every
matrix in blocks of 32, except that q4_x keeps the output matrix (the embedding when tied) in q8_0,
as llama.cpp's quantiser keeps it above 4 bits. A matrix whose rows are not a multiple of 32 values
cannot be cut into blocks and stays f16: export names them (a note, and `f16_fallback_tensors` in
llmkit_export.json).
K-quant mixes (q2_k, q3_k_s/m/l, q4_k_s/m, q5_k_s/m, q6_k) choose each tensor's type and quantise it, with
an importance matrix where given, byte for byte as llama.cpp's quantiser does from the f16 file
(llmkit.hf.gguf_quant_mix, llmkit.hf.gguf_kquants).
Vectors (norms, biases) and Qwen3.5's convolution kernels stay f32 in every file, as llama.cpp
writes them.

What llama.cpp cannot compute is refused by name: mixture-of-experts (not implemented here),
layernorm models, and layers without RoPE other than llama.cpp's `smollm3` pattern (every 4th layer,
fixed in its code: no GGUF key says which), Qwen3.5 shapes its qwen35 graph cannot hold (gguf_qwen35).
transformers reads no `smollm3` or `qwen35` GGUF file, so those are
not read back (`make llama-cpp` builds the client that can). A sliding window shorter than the
context is written as the file's context length: llama.cpp's llama/qwen2 graphs attend to the whole
context, which within the window is the same. `llmkit.hf_config` (the model's transformers
config.json) rides along for `llmkit import`, which restores what transformers' GGUF reader cannot
read from llama.cpp's keys."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from llmkit.checkpoints.step_folders import step_of
from llmkit.errors import ConfigError, UserError
from llmkit.hf.folder import EXPORT_RECORD, write_json
from llmkit.hf.gguf_kquants import f16_rounded, quantize as quantize_blocks
from llmkit.hf.gguf_qwen35 import qwen35_refusal, qwen35_tensor, write_qwen35_architecture
from llmkit.hf.gguf_quant_mix import MIXES, mix_types, read_imatrix, tensor_weights
from llmkit.hf.gguf_read import LLMKIT_HF_CONFIG_KEY, probe_gguf
from llmkit.hf.gguf_rope import rope_scaling_refusal, write_rope_scaling
from llmkit.hf.gguf_source import export_source, vocabulary_writer
from llmkit.hf.gguf_tokenizer import gguf_vocab, write_vocab
from llmkit.hf.mapping import hf_family, to_hf_config
from llmkit.hf.ollama import write_modelfile
from llmkit.hf.ship_check import SHIP_PROMPTS, read_prompts, ship_check

GGUF_QUANTS = ("f16", "bf16", "q8_0", "q4_0", "q4_1", *MIXES)
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "smollm3": "smollm3",
             "qwen3_5_text": "qwen35"}
ROTARY_PERMUTED = ("llama", "smollm3")  # llama.cpp rotates adjacent pairs in these graphs (see permute_rotary_rows)
LLAMA_CPP_NOPE_STEP = 4  # llama.cpp's smollm3 graph skips RoPE where (layer + 1) % 4 == 0
BLOCK = 32  # values per block of q8_0 / q4_0 / q4_1


def gguf_file_name(quant: str) -> str:
    return f"model-{quant}.gguf"


def export_gguf(step_dir: Path, out_dir: Path, cfg) -> dict:
    """Write `out_dir/model-<quant>.gguf` for a step folder; returns the export record. With
    cfg.probe, the file is read back (llmkit.hf.gguf_read) and its parity recorded."""

    step_dir, out_dir = Path(step_dir), Path(out_dir)
    # the file's arrays, unless the model must run (probe, ship check) or be merged (a LoRA step folder)
    model, tokenizer = export_source(step_dir, needs_model=cfg.probe or cfg.ship_check)
    family, context = gguf_layout(model.config, step_dir)
    vocab = gguf_vocab(tokenizer, model.config.vocab_size)
    if family == "smollm3" and vocab.chat_template:  # as convert_hf_to_gguf.py: llama.cpp's jinja has no [:]
        vocab.chat_template = vocab.chat_template.replace("[:]", "")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / gguf_file_name(cfg.quant)
    reads_back = cfg.probe and transformers_reads(GGUF_ARCH[family])  # imports transformers: only to probe
    imatrix = read_imatrix(Path(cfg.imatrix)) if cfg.imatrix else None
    stored, types = write_gguf(path, model, family, context, vocab, cfg.quant, keep_rounded=cfg.probe and reads_back,
                               imatrix=imatrix)
    matrices = [name for name, qtype in types.items() if qtype != "F32"]
    fallback = [name for name in matrices if types[name] == "F16"] if cfg.quant not in ("f16", "bf16") else []
    if cfg.quant in MIXES and (k_fallback := [n for n in matrices if types[n] in ("Q4_0", "Q5_0", "Q5_1")]):
        print(f"note: {len(k_fallback)} matrices of the {cfg.quant} file ({', '.join(k_fallback[:4])}…) have rows "
              "that are not a multiple of 256 values, a K block: they fall back as llama.cpp's quantiser does "
              "(Q2_K and Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0)")
    record = {"format": "gguf", "file": path.name, "quant": cfg.quant, "source": str(step_dir),
              "step": step_of(step_dir), "architecture": GGUF_ARCH[family], "family": family,
              "context_length": context, "parameters": model.num_parameters(), "bytes": path.stat().st_size,
              "tokenizer": vocab.model, "pre_tokenizer": vocab.pre, "tokenizer_notes": "; ".join(vocab.notes),
              "max_abs_logit_diff": None, "greedy_tokens_equal": None, "tokenizer_identical": None,
              "tensor_types": dict(Counter(types.values())), "f16_fallback_tensors": fallback,
              "imatrix": cfg.imatrix or None}
    if fallback:
        print(fallback_note(cfg.quant, fallback, len(matrices)))
    if context < model.config.max_seq_len:
        print(f"note: the model attends within a window of {context} tokens, which llama.cpp's "
              f"{GGUF_ARCH[family]} architecture does not; the GGUF file's context length is {context}")
    record.update(write_modelfile(out_dir, path.name, vocab, tokenizer))
    if cfg.ship_check:  # before the probe, which rounds the model's weights as the file holds them
        record["ship_check"] = run_ship_check(path, model, tokenizer, cfg)
    if cfg.probe and not reads_back:
        print(f"note: transformers cannot read {GGUF_ARCH[family]} GGUF files, so the file was not read back; "
              "llama.cpp's binding (`make llama-cpp`) loads it")
    elif cfg.probe:
        record.update(probe_gguf(path, model, tokenizer, stored, cfg))
    write_json(out_dir / EXPORT_RECORD, record)
    return record


def run_ship_check(path: Path, model, tokenizer, cfg) -> dict:
    """llmkit.hf.ship_check on the written file, with the prompts export names."""

    prompts = read_prompts(cfg.ship_prompts) if cfg.ship_prompts else SHIP_PROMPTS
    return ship_check(path, model.eval(), tokenizer, cfg.quant, prompts, cfg.ship_max_tokens)


def fallback_note(quant: str, fallback: list[str], matrices: int, shown: int = 4) -> str:
    """What a user reads when some matrices could not be quantised: which, and why."""
    names = ", ".join(fallback[:shown]) + (f" and {len(fallback) - shown} more" if len(fallback) > shown else "")
    return (f"note: {len(fallback)} of {matrices} matrices stay F16 in the {quant} file ({names}): their rows "
            f"are not a multiple of {BLOCK} values, the block {quant} quantises; a model whose hidden and "
            f"intermediate sizes are multiples of {BLOCK} is quantised whole")


def gguf_layout(model_config, source: Path) -> tuple[str, int]:
    """(family, context length) of the file, or a UserError naming what llama.cpp cannot run."""

    try:
        family = hf_family(model_config)
    except ConfigError as e:
        raise UserError(f"{source} cannot be exported as GGUF: {e}. llama.cpp's architectures that llmkit "
                        "writes (llama, qwen2 with q/k/v bias, qwen3 with q/k norm) all use RMSNorm and no "
                        "family has both bias and q/k norm: train the model with settings one of them "
                        "has (--set model.norm=rmsnorm, attention_bias or qk_norm, not both)") from None
    if family not in GGUF_ARCH:
        what = (f"a mixture-of-experts model ({model_config.n_experts} experts)" if model_config.n_experts
                else f"a {family} model")
        raise UserError(f"{source} is {what}: llmkit's GGUF export does not write it yet; export --format hf "
                        "and convert that folder with llama.cpp's convert_hf_to_gguf.py")
    nope = model_config.nope_layers or []
    if family == "smollm3" and nope != [i for i in range(model_config.n_layers) if (i + 1) % LLAMA_CPP_NOPE_STEP == 0]:
        raise UserError(f"{source} cannot be exported as GGUF: its layers without RoPE are {nope}, and llama.cpp's "
                        f"smollm3 architecture leaves RoPE out of every {LLAMA_CPP_NOPE_STEP}th layer (3, 7, …) "
                        "whatever the file says; export --format hf instead")
    if family == "qwen3_5_text" and (why := qwen35_refusal(model_config)):
        raise UserError(f"{source} cannot be exported as GGUF: {why}; export --format hf instead")
    if why := rope_scaling_refusal(model_config):
        raise UserError(f"{source} cannot be exported as GGUF: {why}; export --format hf instead")
    import gguf

    if not hasattr(gguf.MODEL_ARCH, GGUF_ARCH[family].upper()):
        raise UserError(f"the installed gguf package ({gguf.__file__}) has no llama.cpp architecture "
                        f"{GGUF_ARCH[family]}, which {source} needs: upgrade it (pip install -U gguf)")
    window = model_config.sliding_window
    return family, min(model_config.max_seq_len, window or model_config.max_seq_len)


def transformers_reads(arch: str) -> bool:
    """Whether transformers' GGUF reader (export's probe, `llmkit import --from FILE.gguf`) knows `arch`."""
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:
        return True  # no transformers: probe_gguf says so itself
    return arch in GGUF_SUPPORTED_ARCHITECTURES


def write_gguf(path: Path, model, family: str, context: int, vocab, quant: str,
               keep_rounded: bool = False, imatrix: dict | None = None) -> tuple[dict, dict[str, str]]:
    """Write the file; returns (with keep_rounded, the weights as the file holds them: dequantised,
    in llmkit's names and layout, for measuring the reader apart from the rounding; each tensor's
    GGML type by its GGUF name). A K-quant mix (llmkit.hf.gguf_quant_mix) quantises the f16 values,
    as llama.cpp's quantiser does from the f16 file, with `imatrix`'s column weights where given."""
    cfg = model.config
    arch = GGUF_ARCH[family]
    writer = vocabulary_writer(path, arch)
    # not the family: transformers' GGUF reader turns a `llama` file named "mistral…" into a Mistral
    # model that it then cannot load (gguf-py has no "mistral" architecture)
    writer.add_name(f"llmkit-{arch}")
    write_architecture(writer, cfg, context, quant)
    write_vocab(writer, vocab)
    hf_config = to_hf_config(cfg)
    writer.add_string(LLMKIT_HF_CONFIG_KEY, json.dumps(hf_config))
    rounded, types = {}, {}
    tensors = list(gguf_tensors(model, arch))
    if quant in MIXES:
        mix = mix_types(quant, {gguf_name: array.shape for _, gguf_name, array in tensors}, cfg.n_layers,
                        n_gqa=cfg.n_heads // cfg.n_kv_heads)

    def encode(gguf_name, array):  # one thread each: the kernels and numpy's casts release the GIL
        if quant in MIXES:
            return encode_mix_tensor(array, mix[gguf_name], tensor_weights(imatrix, gguf_name, array.shape[-1]),
                                     threads=1)
        return encode_tensor(array, quant, gguf_name, cfg.tie_embeddings)

    # tensors are encoded side by side, not rows of one tensor at a time: a vocabulary's worth of
    # small matrices leaves threads over rows idle, and the f16 rounding runs in parallel too
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        jobs = [(name, gguf_name, array, pool.submit(encode, gguf_name, array)) for name, gguf_name, array in tensors]
        for name, gguf_name, array, job in jobs:
            data, qtype = job.result()
            writer.add_tensor(gguf_name, data, raw_dtype=qtype)
            types[gguf_name] = qtype.name
            if keep_rounded and name is not None:
                rounded[name] = decode_tensor(data, qtype, array.shape, arch, gguf_name, cfg)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return rounded, types


FILE_TYPES = {"f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0", "q4_0": "MOSTLY_Q4_0",
              "q4_1": "MOSTLY_Q4_1", **{quant: file_type for quant, (file_type, _) in MIXES.items()}}


def write_architecture(writer, cfg, context: int, quant: str) -> None:
    """The hyper-parameters as llama.cpp reads them (`<arch>.*` keys)."""
    import gguf

    writer.add_context_length(context)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.n_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.rotary_dim)  # the whole head but in Qwen3.5
    writer.add_rope_freq_base(cfg.rope_theta)
    if cfg.rope_scaling:  # linear and yarn as keys; llama3 is the rope_freqs tensor (plain RoPE: no import of torch)
        write_rope_scaling(writer, cfg)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES[quant]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if writer.arch == "qwen35":
        write_qwen35_architecture(writer, cfg)


def gguf_tensors(model, arch: str):
    """(llmkit name or None, GGUF name, float32 array as the file stores it) for every tensor: the
    tied lm_head left out (llama.cpp then uses the embedding), `rope_freqs` added for Llama 3
    RoPE scaling."""
    import gguf

    cfg = model.config
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), cfg.n_layers)
    # one order whatever holds the weights (a model's modules, or a checkpoint file's sorted keys),
    # so a file's bytes do not depend on whether export loaded the model: layers by number
    for name, tensor in sorted(model.state_dict().items(), key=lambda item: natural_key(item[0])):
        if cfg.tie_embeddings and name == "lm_head.weight":
            continue
        array, source = float_array(tensor), name
        if arch == "qwen35":
            source, array = qwen35_tensor(name, array, cfg)
        gguf_name = names.get_name(source, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise UserError(f"the model's tensor {name} has no llama.cpp name in the {arch} architecture")
        if arch in ROTARY_PERMUTED and gguf_name.endswith("attn_q.weight"):
            array = permute_rotary_rows(array, cfg.n_heads)
        elif arch in ROTARY_PERMUTED and gguf_name.endswith("attn_k.weight"):
            array = permute_rotary_rows(array, cfg.n_kv_heads)
        yield name, gguf_name, array
    if cfg.rope_scaling and cfg.rope_scaling.get("rope_type") == "llama3":
        yield None, gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", llama3_rope_factors(cfg)


def natural_key(name: str) -> list:
    """'model.layers.10.mlp' after 'model.layers.2.mlp': numbers compared as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in name.split(".")]


def float_array(tensor):
    """A float32 numpy array of a model's tensor or a checkpoint's array (a float32 one not copied)."""
    import numpy as np

    if hasattr(tensor, "detach"):
        return tensor.detach().float().cpu().numpy()
    return np.asarray(tensor, dtype=np.float32)


def permute_rotary_rows(weight, n_heads: int):
    """llama.cpp's `LlamaModel.permute`: Hugging Face rotates each head's two halves (i, i + d/2),
    llama.cpp's llama graph rotates adjacent pairs (2i, 2i + 1); reorder each head's output rows
    so that the pairs llama.cpp rotates are the ones Hugging Face rotates."""
    return (weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def unpermute_rotary_rows(weight, n_heads: int):
    return (weight.reshape(n_heads, weight.shape[0] // n_heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def llama3_rope_factors(cfg):
    """The per-frequency divisors of Llama 3 RoPE scaling, as convert_hf_to_gguf.py computes them
    (llama.cpp divides each rotary frequency by its factor)."""
    import numpy as np

    s = cfg.rope_scaling
    freqs = 1.0 / (cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float32) / cfg.head_dim))
    old_context = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / s["low_freq_factor"], old_context / s["high_freq_factor"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(s["factor"])
        else:
            smooth = (old_context / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return np.asarray(factors, dtype=np.float32)


QTYPES = {"f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1"}


def tensor_qtype(quant: str, gguf_name: str, shape: tuple[int, ...], tied: bool) -> str:
    """The GGML type one tensor is stored in (see the module docstring)."""
    # the Gated DeltaNet convolution stays F32, as llama.cpp's converter and quantiser keep it
    if len(shape) < 2 or gguf_name.startswith("rope_freqs") or ".ssm_conv1d." in gguf_name:
        return "F32"
    if quant in ("f16", "bf16"):
        return QTYPES[quant]
    if shape[-1] % BLOCK:
        return "F16"
    keeps_precision = gguf_name == "output.weight" or (tied and gguf_name == "token_embd.weight")
    if quant in ("q4_0", "q4_1") and keeps_precision:
        return "Q8_0"
    return QTYPES[quant]


def encode_tensor(array, quant: str, gguf_name: str, tied: bool):
    """(bytes as a numpy array, GGMLQuantizationType) of one tensor."""
    import gguf
    import numpy as np

    qtype = getattr(gguf.GGMLQuantizationType, tensor_qtype(quant, gguf_name, array.shape, tied))
    if qtype == gguf.GGMLQuantizationType.F32:
        return np.ascontiguousarray(array, dtype=np.float32), qtype
    if qtype == gguf.GGMLQuantizationType.F16:
        return np.ascontiguousarray(array, dtype=np.float16), qtype
    return gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype), qtype


def encode_mix_tensor(array, qtype: str, weights, threads: int | None = None):
    """(bytes, GGMLQuantizationType) of one tensor of a K-quant mix, from its f16 values."""
    import gguf
    import numpy as np

    if qtype == "F32":
        return np.ascontiguousarray(array, dtype=np.float32), gguf.GGMLQuantizationType.F32
    if qtype == "F16":
        return np.ascontiguousarray(array, dtype=np.float16), gguf.GGMLQuantizationType.F16
    # the f16 values llama.cpp's quantiser reads, rounded in the kernel (numpy's casts cost 1.3 s a 135M model)
    return (quantize_blocks(f16_rounded(array), qtype, weights, threads),
            getattr(gguf.GGMLQuantizationType, qtype))


def decode_tensor(data, qtype, shape, arch: str, gguf_name: str, cfg):
    """The float32 torch tensor `data` holds, back in llmkit's layout (q/k rows un-permuted)."""
    import gguf
    import numpy as np
    import torch

    values = gguf.quants.dequantize(data, qtype).astype(np.float32).reshape(shape)
    if arch in ROTARY_PERMUTED and gguf_name.endswith("attn_q.weight"):
        values = unpermute_rotary_rows(values, cfg.n_heads)
    elif arch in ROTARY_PERMUTED and gguf_name.endswith("attn_k.weight"):
        values = unpermute_rotary_rows(values, cfg.n_kv_heads)
    return torch.from_numpy(np.ascontiguousarray(values))
