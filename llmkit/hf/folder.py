"""What a transformers model folder holds (its file names) and the JSON files llmkit reads and
writes there."""

from __future__ import annotations

import json
from pathlib import Path

from llmkit.errors import UserError

EXPORT_RECORD = "llmkit_export.json"
HF_WEIGHTS = "model.safetensors"
HF_CONFIG = "config.json"
HF_GENERATION_CONFIG = "generation_config.json"
HF_TOKENIZER = "tokenizer.json"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
SHARD_INDEX = "model.safetensors.index.json"
LLMKIT_TOKENIZER_KEY = "llmkit"  # tokenizer_config.json key holding llmkit's own tokenizer config
DTYPES = ("auto", "float32", "bfloat16", "float16")


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is unreadable ({e})") from None


def write_json(path: Path, obj) -> None:
    Path(path).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
