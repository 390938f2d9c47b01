"""`llmkit export --format gguf --set adapter_only=true`: a LoRA run's adapters as a llama.cpp adapter
file (`lora_path` of llama-cpp-python, `--lora` of llama-cli / llama-server, `ADAPTER` of an Ollama
Modelfile), for the GGUF file of the base it was trained on (export the base's step folder, the
run's pinned `base/`, with --format gguf).

Laid out as llama.cpp's convert_lora_to_gguf.py lays out a peft adapter: `general.type=adapter`,
`adapter.type=lora`, `adapter.lora.alpha`, and for each adapted matrix its GGUF name with
`.lora_a` (peft's lora_A, [r, in]) and `.lora_b` (lora_B, [out, r]); the rows of an attention
q/k adapter's lora_b are permuted as the base's q/k rows are (llama.cpp rotates adjacent pairs:
gguf_export.permute_rotary_rows), lora_a is untouched. llama.cpp scales the product by
alpha / rank, peft by alpha / r, or alpha / sqrt(r) under rsLoRA: an rsLoRA run's file carries
alpha * sqrt(r), the same scale.

What llama.cpp's adapters cannot hold is refused by name: DoRA's magnitudes, a head trained in
full beside the adapters (rm's `score`), rows added to the vocabulary."""

from __future__ import annotations

import json
import math
from pathlib import Path

from llmkit.checkpoints.lora import base_of, holds_adapters
from llmkit.checkpoints.lora_files import PEFT_PREFIX
from llmkit.checkpoints.step_folders import ADAPTER_CONFIG, ADAPTER_WEIGHTS, step_of
from llmkit.errors import UserError
from llmkit.hf.folder import EXPORT_RECORD, write_json
from llmkit.checkpoints.loading import load_model
from llmkit.hf.gguf_export import GGUF_ARCH, ROTARY_PERMUTED, gguf_layout, permute_rotary_rows

ADAPTER_TYPES = {"f16": "F16", "bf16": "BF16"}


def adapter_file_name(quant: str) -> str:
    return f"adapter-{quant}.gguf"


def export_gguf_adapter(step_dir: Path, out_dir: Path, cfg) -> dict:
    """Write `out_dir/adapter-<quant>.gguf` for a LoRA step folder; returns the export record."""

    step_dir, out_dir = Path(step_dir), Path(out_dir)
    if not holds_adapters(step_dir):
        raise UserError(f"{step_dir} holds no LoRA adapters (adapter_only=true exports a LoRA run's): drop "
                        "adapter_only to write the whole model")
    if cfg.quant not in ADAPTER_TYPES:
        raise UserError(f"export adapter_only=true writes the adapters in f16 or bf16, not quant={cfg.quant} "
                        "(llama.cpp applies them to a base file of any quant)")
    peft_config = json.loads((step_dir / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    if peft_config.get("use_dora"):
        raise UserError(f"{step_dir}: DoRA adapters (lora.use_dora) have a magnitude per row that llama.cpp's "
                        "adapters cannot hold; export the merged model instead (drop adapter_only)")
    base = base_of(step_dir)
    model, _ = load_model(base, None)  # the base's shape and family: the file is for its GGUF
    family, _ = gguf_layout(model.config, step_dir)
    arch = GGUF_ARCH[family]
    if arch == "qwen35":
        raise UserError(f"{step_dir}: adapters of the qwen35 layout (tiled value heads) are not written; "
                        "export the merged model instead (drop adapter_only)")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / adapter_file_name(cfg.quant)
    pairs = adapter_pairs(step_dir)
    alpha = float(peft_config["lora_alpha"])
    rank = int(peft_config["r"])
    if peft_config.get("use_rslora"):
        alpha *= math.sqrt(rank)  # llama.cpp scales by alpha / rank, rsLoRA by alpha / sqrt(rank)
    names = write_adapter(path, pairs, arch, model.config, alpha, ADAPTER_TYPES[cfg.quant])
    print(f"note: {path.name} adapts the GGUF file of {base} (export it with --from {base} --format gguf); "
          f"llama.cpp: --model BASE.gguf --lora {path.name}; Ollama: ADAPTER ./{path.name} in the base's Modelfile")
    record = {"format": "gguf", "kind": "lora adapter", "file": path.name, "quant": cfg.quant, "source": str(step_dir),
              "step": step_of(step_dir), "base": str(base), "architecture": arch, "family": family,
              "parameters": sum(a.numel() + b.numel() for a, b in pairs.values()), "bytes": path.stat().st_size,
              "lora_alpha": alpha, "rank": rank, "adapted_tensors": names,
              "max_abs_logit_diff": None, "greedy_tokens_equal": None, "tokenizer_identical": None}
    write_json(out_dir / EXPORT_RECORD, record)
    return record


def adapter_pairs(step_dir: Path) -> dict:
    """{llmkit module weight name: (lora_A, lora_B)} of peft's adapter_model.safetensors."""
    from safetensors.torch import load_file

    pairs: dict = {}
    for name, tensor in load_file(str(step_dir / ADAPTER_WEIGHTS)).items():
        module = name.removeprefix(PEFT_PREFIX)
        for part, index in ((".lora_A.weight", 0), (".lora_B.weight", 1)):
            if module.endswith(part):
                pairs.setdefault(module[:-len(part)] + ".weight", [None, None])[index] = tensor.float()
                break
        else:
            raise UserError(f"{step_dir / ADAPTER_WEIGHTS}: {name} is not a LoRA matrix (a head trained in full, "
                            "or rows added to the vocabulary), which llama.cpp's adapter files cannot hold; "
                            "export the merged model instead (drop adapter_only)")
    missing = [n for n, (a, b) in pairs.items() if a is None or b is None]
    if missing:
        raise UserError(f"{step_dir / ADAPTER_WEIGHTS}: {missing[0]} has only one of lora_A and lora_B")
    return {n: tuple(p) for n, p in pairs.items()}


def write_adapter(path: Path, pairs: dict, arch: str, model_config, alpha: float, qtype: str) -> list[str]:
    """Write the adapter file; returns the GGUF names of the matrices it adapts."""
    import gguf
    import numpy as np


    if model_config.tie_embeddings and any(n == "lm_head.weight" for n in pairs):
        raise UserError("the adapters adapt lm_head, which a tied model's GGUF file does not hold "
                        "(llama.cpp uses the embedding); export the merged model instead (drop adapter_only)")
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), model_config.n_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    writer.add_name(f"llmkit-{arch}-lora")
    dtype = {"F16": np.float16, "BF16": np.float32}[qtype]
    written = []
    for name, (a, b) in sorted(pairs.items()):
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise UserError(f"the adapters adapt {name}, which has no llama.cpp name in the {arch} architecture")
        a, b = a.numpy(), b.numpy()
        if arch in ROTARY_PERMUTED and gguf_name.endswith("attn_q.weight"):
            b = permute_rotary_rows(b, model_config.n_heads)
        elif arch in ROTARY_PERMUTED and gguf_name.endswith("attn_k.weight"):
            b = permute_rotary_rows(b, model_config.n_kv_heads)
        for suffix, array in ((".lora_a", a), (".lora_b", b)):
            array = np.ascontiguousarray(array, dtype=dtype)
            if qtype == "BF16":
                array = gguf.quants.quantize(array, gguf.GGMLQuantizationType.BF16)
            writer.add_tensor(gguf_name + suffix, array, raw_dtype=getattr(gguf.GGMLQuantizationType, qtype))
        written.append(gguf_name)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written
