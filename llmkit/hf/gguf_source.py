"""What `export --format gguf` reads and how it writes: a full checkpoint's tensors as numpy arrays
straight from its safetensors file (no torch, no model), and a GGUF writer that packs the
vocabulary's arrays in one go.

A GGUF file needs only the checkpoint's tensors, its config.json and its tokenizer. Loading the
model for them cost more than quantising it: importing torch, building the Transformer, copying
every tensor out of the file (on a loaded 2-core machine, 4-5 s of a 135M q4_k_m export that
llama.cpp's quantiser does in 4). So unless the export needs the model itself — a LoRA checkpoint
to merge, the probe or the ship check to run it — the file is memory-mapped and its tensors
handed on as views (bf16 widened to float32 exactly, by its bits), with the same checks and the
same messages as `llmkit.checkpoints.loading.load`.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmkit.checkpoints.loading import check_language_model, load, load_tokenizer, model_config_from
from llmkit.checkpoints.lora import holds_adapters
from llmkit.checkpoints.step_folders import MODEL_CONFIG, WEIGHTS, checkpoint_step_dir, weights_problem
from llmkit.errors import UserError

SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "uint16", "F64": "float64"}


class CheckpointArrays:
    """The part of a Transformer GGUF export reads: `config`, `state_dict()` (name -> numpy array,
    tied names sharing one array, as the model's state dict lists them) and `num_parameters()`."""

    def __init__(self, config, tensors: dict):
        self.config = config
        self.tensors = tensors

    def state_dict(self) -> dict:
        return self.tensors

    def num_parameters(self) -> int:  # a tied matrix once, as Transformer.num_parameters counts it
        return sum(array.size for array in {id(a): a for a in self.tensors.values()}.values())


def export_source(step_dir, needs_model: bool):
    """(model or CheckpointArrays, tokenizer) of a checkpoint: the model itself (llmkit's `load`)
    where `needs_model` or the checkpoint holds LoRA adapters, else its file's arrays."""
    step_dir = checkpoint_step_dir(step_dir)
    if needs_model or holds_adapters(step_dir):
        return load(step_dir)
    if problem := weights_problem(step_dir / WEIGHTS):
        raise UserError(f"{step_dir}: {problem}")
    try:
        config = json.loads((step_dir / MODEL_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{step_dir / MODEL_CONFIG} unreadable ({e}); the checkpoint is damaged") from None
    if "llmkit_head" in config or "model_type" in config:  # loading's refusals; its check imports torch for the key
        check_language_model(config, step_dir)
    arrays = CheckpointArrays(model_config_from(config, step_dir), read_arrays(step_dir / WEIGHTS))
    tokenizer = load_tokenizer(step_dir)
    if tokenizer.vocab_size > arrays.config.vocab_size:
        raise UserError(f"{step_dir}: the tokenizer has {tokenizer.vocab_size} tokens but the model's "
                        f"vocab_size is {arrays.config.vocab_size}; the checkpoint's tokenizer/ folder "
                        "belongs to another model")
    return arrays, tokenizer


def read_arrays(path: Path) -> dict:
    """A safetensors file's tensors as numpy arrays over its memory mapping (float32, float16, or
    bf16 widened to float32), tied aliases (the `tied` metadata llmkit writes) sharing one array."""
    import numpy as np

    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tied = json.loads((header.pop("__metadata__", None) or {}).get("tied", "{}"))
    arrays = {}
    for key, entry in header.items():
        dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise UserError(f"{path}: tensor {key} is {entry['dtype']}, which the GGUF export does not read")
        start, end = entry["data_offsets"]
        array = data[start:end].view(dtype).reshape(entry["shape"])
        if entry["dtype"] == "BF16":  # the top half of a float32's bits: exact
            array = (array.astype(np.uint32) << 16).view(np.float32)
        arrays[key] = array
    for alias, kept in tied.items():
        arrays[alias] = arrays[kept]
    return arrays


def vocabulary_writer(path, arch: str):
    """gguf.GGUFWriter whose arrays of strings and numbers (the vocabulary's 50-250k tokens, scores,
    types, merges) are packed whole: gguf packs each item in Python, about a second a vocabulary.
    The bytes are the same (little-endian only; anything else goes to gguf's own packing)."""
    import gguf

    global _WRITER
    if _WRITER is None:
        _WRITER = type("VocabularyWriter", (gguf.GGUFWriter,), {"_pack_val": _pack_val})
    return _WRITER(str(path), arch)


_WRITER = None
NUMBER_DTYPES = {"UINT8": "<u1", "INT8": "<i1", "UINT16": "<u2", "INT16": "<i2", "UINT32": "<u4", "INT32": "<i4",
                 "UINT64": "<u8", "INT64": "<i8", "FLOAT32": "<f4", "FLOAT64": "<f8"}


def _pack_val(self, val, vtype, add_vtype, sub_type=None):
    import struct

    import gguf
    import numpy as np

    packed = None
    if (vtype == gguf.GGUFValueType.ARRAY and isinstance(val, (list, tuple)) and val
            and self.endianess == gguf.GGUFEndian.LITTLE):
        ltype = sub_type or gguf.GGUFValueType.get_type(val[0])
        if ltype == gguf.GGUFValueType.STRING and all(isinstance(item, (str, bytes)) for item in val):
            encoded = [item.encode("utf-8") if isinstance(item, str) else item for item in val]
            packed = b"".join(struct.pack("<Q", len(item)) + item for item in encoded)
        elif ltype.name in NUMBER_DTYPES and (sub_type or all(gguf.GGUFValueType.get_type(i) is ltype for i in val)):
            packed = np.asarray(val).astype(NUMBER_DTYPES[ltype.name], casting="same_kind").tobytes()
    if packed is None:
        return gguf.GGUFWriter._pack_val(self, val, vtype, add_vtype, sub_type)
    return (struct.pack("<I", vtype) if add_vtype else b"") + struct.pack("<IQ", ltype, len(val)) + packed
