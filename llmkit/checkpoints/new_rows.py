"""The rows `llmkit extend-vocab` added, trained under LoRA (peft's `trainable_token_indices`).

A LoRA run on an extended model trains, beside its adapters, the embedding rows of the new pieces
and, for an untied head, their output rows (a tied head reads the same trained rows). Only those
rows: the old vocabulary's rows stay bitwise the base's, so text without the new pieces computes
as the base plus the adapters, and the adapter file grows by rows x hidden values (8,000 x 576 for
SmolLM2) instead of a whole embedding (`modules_to_save=["embed_tokens"]`, Chinese-LLaMA's choice,
49,152 x 576 more, and every English row drifting). It is peft's own mechanism for added tokens, so
adapter_config.json records `trainable_token_indices` and adapter_model.safetensors holds
`...embed_tokens.token_adapter.trainable_tokens_delta`: `PeftModel.from_pretrained` on the exported
base reads them as they are.

The extended tokenizer folder names its new ids (`extension.json`, written by extend-vocab); every
checkpoint copies the tokenizer, so a LoRA run on any later run of that model finds them.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmkit.checkpoints.step_folders import TOKENIZER

EXTENSION_FILE = "extension.json"  # in an extended tokenizer folder: {"new_token_ids": [...], ...}
EMBEDDING, HEAD = "embed_tokens", "lm_head"
ADAPTER_NAME = "default"  # peft's name of a model's one adapter (as lora.ADAPTER_NAME)
DELTA = "trainable_tokens_delta"  # what peft calls the trained rows


def write_extension(tokenizer_dir: Path, ids: list[int], **about) -> None:
    (Path(tokenizer_dir) / EXTENSION_FILE).write_text(json.dumps({"new_token_ids": ids, **about}) + "\n",
                                                       encoding="utf-8")


def new_token_ids(step_dir) -> list[int]:
    """The ids extend-vocab added to the tokenizer of step folder `step_dir` ([] when none)."""
    path = Path(step_dir) / TOKENIZER / EXTENSION_FILE
    return json.loads(path.read_text(encoding="utf-8"))["new_token_ids"] if path.is_file() else []


def trainable_token_indices(model, ids: list[int]) -> dict | None:
    """peft's `trainable_token_indices` for `ids`: the embedding, and the head when it is untied
    (transformers ties a tied head itself); None without ids."""
    if not ids:
        return None
    untied = any(head is not None and head.weight is not embedding.weight
                 for _, embedding, _, head in embeddings_and_heads(model))
    return {EMBEDDING: list(ids), **({HEAD: list(ids)} if untied else {})}


def add_new_rows(model, indices: dict | None, inference_mode: bool = False) -> None:
    """Wrap each decoder's embedding (and head) of `model` so that rows `indices[embed_tokens]` are a
    trainable copy (peft's TrainableTokensWrapper; a tied head shares the embedding's copy)."""
    if not indices:
        return
    from peft.utils import TrainableTokensWrapper

    ids = indices[EMBEDDING]
    for embedding_name, embedding, head_name, head in list(embeddings_and_heads(model)):
        wrapper = _wrap(model, embedding_name, TrainableTokensWrapper, ids, None, inference_mode)
        if head is not None:
            tied = head.weight is embedding.weight
            _wrap(model, head_name, TrainableTokensWrapper, ids, wrapper.token_adapter if tied else None,
                  inference_mode)


def _wrap(model, name: str, wrapper_cls, ids, tied_adapter, inference_mode: bool):
    parent, _, leaf = name.rpartition(".")
    wrapper = wrapper_cls(model.get_submodule(name), ADAPTER_NAME, token_indices=ids, tied_adapter=tied_adapter)
    wrapper.set_adapter(ADAPTER_NAME, inference_mode=inference_mode)
    setattr(model.get_submodule(parent) if parent else model, leaf, wrapper)
    return wrapper


def embeddings_and_heads(model):
    """(embedding name, embedding, head name or None, head or None) of each decoder in `model` (a
    Transformer, or a module holding some: a policy and its value trunk)."""
    import torch.nn as nn

    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and name.rsplit(".", 1)[-1] == EMBEDDING:
            trunk = name.rpartition(".")[0].rpartition(".")[0]  # X.model.embed_tokens -> X
            head_name = f"{trunk}.{HEAD}" if trunk else HEAD
            head = _submodule(model, head_name)
            yield name, module, (head_name if isinstance(head, nn.Linear) else None), (
                head if isinstance(head, nn.Linear) else None)


def _submodule(model, name: str):
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def is_new_rows_tensor(name: str) -> bool:
    return f".{DELTA}." in f"{name}."


def merge_new_rows(model) -> None:
    """Write the trained rows into the embedding (and head) and put the plain modules back, in place;
    a tied head stays the embedding's matrix."""
    from peft.utils import TrainableTokensWrapper

    for name, module in [(n, m) for n, m in model.named_modules() if isinstance(m, TrainableTokensWrapper)]:
        adapter = module.token_adapter
        adapter.merge()  # a tied head's adapter writes the same rows into the same matrix
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, adapter.get_base_layer())
