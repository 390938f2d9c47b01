"""`llmkit import`: a local transformers folder of a family llmkit implements (Llama 3.x, SmolLM2,
SmolLM3, Qwen2/2.5, Qwen3, Qwen3.5 and Qwen3.5-MoE (their language models), Qwen3-Next, Mistral,
Mixtral; safetensors, sharded or not) or a GGUF file (dequantised by transformers, or for llama.cpp's
qwen35 and smollm3 by llmkit.hf.gguf_layout_read) -> a checkpoint run
with one complete step folder, `step-00000000/`, that carries the model's own tokenizer
(`tokenizer.json` with its chat template, as AutoTokenizer reads the folder, or a sentencepiece
`tokenizer.model`). Everything is read and checked before the run's folder is made, so a refused
import leaves nothing behind."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from llmkit.checkpoints import step_folders as ckpt
from llmkit.checkpoints.step_folders import read_weights, weights_problem
from llmkit.errors import ConfigError, UserError
from llmkit.hf.folder import DTYPES, HF_CONFIG, HF_TOKENIZER, SHARD_INDEX, read_json, write_json
from llmkit.hf.gguf_layout_read import (LAYOUT_ARCHS, GGUFFile, gguf_architecture, layout_hf_config,
                                        layout_state_dict, save_layout_tokenizer, transformers_gguf_architectures)
from llmkit.hf.gguf_read import load_gguf_with_transformers
from llmkit.hf.mapping import LEFT_OUT, from_hf_config, from_hf_state_dict
from llmkit.hf.tokenizer import ModelTokenizer, model_tokenizer, write_model_tokenizer
from llmkit.model.config import ModelConfig
from llmkit.core.progress import print_summary
from llmkit.tokenizers.sentencepiece import MODEL_FILE


@dataclass
class ImportConfig:
    dtype: str = "auto"  # weights stored as: auto (as in the transformers folder), float32, bfloat16, float16

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ConfigError(f"import dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")


@dataclass
class SourceModel:
    """A model read and checked, before an import writes anything: a refusal leaves no folder."""
    path: Path            # the transformers folder or GGUF file
    hf_config: dict       # its config.json
    config: ModelConfig
    state_dict: dict      # llmkit's names, fitting Transformer(config)
    tokenizer_dir: Path   # where its own tokenizer is


def run_import(ctx, cfg: ImportConfig, source: str, tokenizer: str | None = None):
    """`llmkit import`: a transformers folder -> checkpoint run `ctx.out` (default "imported")."""
    import tempfile

    src = Path(source)
    if src.suffix != ".gguf" and not (src / HF_CONFIG).is_file():
        raise UserError(f"{src} is not a transformers model folder (no {HF_CONFIG}) nor a .gguf file; give "
                        "the folder that save_pretrained wrote")
    tokenizer_dir = _tokenizer_source(ctx.workspace, tokenizer) if tokenizer else None
    files = [src] if src.is_file() else sorted(p for p in src.iterdir() if p.is_file())
    identity = {"source": str(src.resolve()), "tokenizer": str(tokenizer_dir) if tokenizer_dir else None,
                "files": {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in files}}
    b = ctx.workspace.builder(ctx.out_name("imported"), stage="import",
                              config={**dataclasses.asdict(cfg), **identity}, force=ctx.force)
    if b.up_to_date:
        return b
    with tempfile.TemporaryDirectory(prefix="llmkit-import-") as scratch:  # a GGUF file's tokenizer
        model = read_gguf(src, Path(scratch)) if src.suffix == ".gguf" else read_hf_folder(src)
        model_tok = model_tokenizer(tokenizer_dir or model.tokenizer_dir, model.config.vocab_size)
        with b:
            b.stats.update(write_imported_run(model, model_tok, b.dir, cfg))
    print_summary(f"import done: {b.final}", [(k, v) for k, v in b.stats.items()])
    return b


def read_hf_folder(src: Path) -> SourceModel:
    """The model of a transformers folder (config.json, safetensors weights)."""
    src = Path(src)
    hf_config = read_json(src / HF_CONFIG)
    model_config = imported_model_config(hf_config, src)  # before the weights: a refusal costs nothing
    weights = read_hf_weights(src)
    note_left_out(src, weights)
    return SourceModel(src, hf_config, model_config, fitted_state_dict(weights, model_config, src), src)


def note_left_out(src: Path, weights: dict) -> None:
    """Say on stderr which parts of a checkpoint llmkit's model has no place for (Qwen3.5's vision
    tower and multi-token prediction head) and so leaves out."""
    import sys

    for prefix, what in LEFT_OUT.items():
        if n := sum(k.startswith(prefix) for k in weights):
            print(f"note: {src}: {what} ({n} tensors) left out; the language model is imported", file=sys.stderr)


def read_gguf(path: Path, scratch: Path) -> SourceModel:
    """The model of a GGUF file: transformers dequantises its weights (to float32) and rebuilds its
    tokenizer (tokenizer.json + chat template), saved in `scratch`; llmkit reads qwen35 and smollm3
    files itself (read_gguf_layout)."""
    import importlib.util

    missing = [m for m in ("gguf", "accelerate", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"{path}: reading GGUF needs {', '.join(missing)}: pip install 'llmkit[gguf]'")
    arch = gguf_architecture(path)
    if arch in LAYOUT_ARCHS:
        return read_gguf_layout(path, scratch)
    readable = transformers_gguf_architectures() - {"general", "tokenizer"}
    if arch is not None and arch not in readable:
        raise UserError(f"{path}: llama.cpp architecture {arch!r} is read neither by llmkit ({', '.join(LAYOUT_ARCHS)}) "
                        f"nor by the installed transformers ({', '.join(sorted(readable))}); import the "
                        "transformers folder the file was converted from")

    try:  # transformers, with what its GGUF reader leaves out put back
        model, hf_tokenizer, _ = load_gguf_with_transformers(path)
        hf_tokenizer.save_pretrained(scratch)
    except Exception as e:  # struct.error for a cut file, ValueError, a config validator's error, …
        raise UserError(f"{path}: transformers cannot read this GGUF file ({type(e).__name__}: {str(e)[:300]}); "
                        "if it was downloaded or copied, check that the file is complete") from None
    hf_config = model.config.to_dict()
    model_config = imported_model_config(hf_config, path)
    return SourceModel(path, hf_config, model_config, fitted_state_dict(model.state_dict(), model_config, path),
                       scratch)


def read_gguf_layout(path: Path, scratch: Path) -> SourceModel:
    """The model of a qwen35 or smollm3 GGUF file, which llmkit reads itself (llmkit.hf.gguf_layout_read);
    its tokenizer saved in `scratch`."""
    gguf_file = GGUFFile(path)
    hf_config = layout_hf_config(gguf_file)
    model_config = imported_model_config(hf_config, path)
    state_dict = layout_state_dict(gguf_file, model_config, model_shapes(model_config))
    save_layout_tokenizer(gguf_file, scratch)
    return SourceModel(path, hf_config, model_config, state_dict, scratch)


def imported_model_config(hf_config: dict, src: Path) -> ModelConfig:
    """The ModelConfig of a transformers config; a UserError naming what llmkit cannot read."""

    try:
        return from_hf_config(hf_config)
    except (ConfigError, KeyError) as e:
        raise UserError(f"{src}: {e if isinstance(e, ConfigError) else f'config.json lacks the key {e}'}") from None


def fitted_state_dict(weights: dict, model_config: ModelConfig, src: Path) -> dict:
    """transformers' weights under llmkit's names; a UserError unless they fit the config."""
    state_dict = from_hf_state_dict(weights, model_config)
    shapes = model_shapes(model_config)
    missing = sorted(set(shapes) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(shapes))
    wrong = [f"{k} {tuple(state_dict[k].shape)} where {HF_CONFIG} gives {shapes[k]}" for k in shapes
             if k in state_dict and tuple(state_dict[k].shape) != shapes[k]]
    if missing or unexpected or wrong:
        raise UserError(f"{src}: the weights do not fit {HF_CONFIG} (missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]}, wrong shape {wrong[:3]})")
    return state_dict


def model_shapes(model_config: ModelConfig) -> dict[str, tuple]:
    """The shape of every tensor of llmkit's Transformer(model_config), by name (built on the meta
    device: no memory)."""
    import torch

    from llmkit.model.transformer import Transformer

    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in Transformer(model_config).state_dict().items()}


def write_imported_run(model: SourceModel, tokenizer: ModelTokenizer, run_dir: Path, cfg: ImportConfig) -> dict:
    """`run_dir/step-00000000/` (weights, config.json, trainer_state.json, tokenizer/, complete) and
    `run_dir/latest`; returns counts for the manifest."""
    import torch

    state_dict = model.state_dict
    if cfg.dtype != "auto":
        state_dict = {k: v.to(getattr(torch, cfg.dtype)) for k, v in state_dict.items()}
    step_dir = Path(run_dir) / ckpt.step_dir_name(0)
    step_dir.mkdir(parents=True, exist_ok=True)
    write_model_tokenizer(tokenizer, step_dir / ckpt.TOKENIZER)
    tied = {"lm_head.weight": "model.embed_tokens.weight"} if model.config.tie_embeddings else {}
    ckpt.save_weights(step_dir / ckpt.WEIGHTS, state_dict, tied)
    write_json(step_dir / ckpt.MODEL_CONFIG, dataclasses.asdict(model.config))
    write_json(step_dir / ckpt.TRAINER_STATE, {"step": 0, "tokens_seen": 0, "imported_from": str(model.path)})
    ckpt.mark_complete(step_dir)
    n_params = sum(v.numel() for k, v in state_dict.items() if k not in tied)
    hf_config = model.hf_config
    return {"architecture": (hf_config.get("architectures") or [hf_config["model_type"]])[0],
            "parameters": n_params, "vocab_size": model.config.vocab_size, "tokenizer_vocab": tokenizer.vocab_size,
            "dtype": str(next(iter(state_dict.values())).dtype).removeprefix("torch.")}


def read_hf_weights(src: Path) -> dict:
    """Every tensor of a transformers folder's safetensors files (one file, or shards listed in
    model.safetensors.index.json). Pickled .bin weights are refused: loading them runs code."""
    src = Path(src)
    if (src / SHARD_INDEX).is_file():
        index = read_json(src / SHARD_INDEX)
        files = sorted({src / name for name in index.get("weight_map", {}).values()})
    else:
        files = sorted(src.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in src.glob("*.bin"))
        hint = (f" (it has {', '.join(pickles[:3])}: pickles are never loaded; re-save the model with "
                "save_pretrained(..., safe_serialization=True))") if pickles else ""
        raise UserError(f"{src} has no .safetensors weights{hint}")
    weights = {}
    for f in files:
        problem = weights_problem(f) if f.is_file() else "it is missing"
        if problem:
            raise UserError(f"{f}: {problem}")
        weights.update(read_weights(f))
    return weights


def _tokenizer_source(workspace, name_or_path: str) -> Path:
    """A tokenizer folder: a workspace artifact name, or a path."""
    candidates = [workspace.root / name_or_path, Path(name_or_path)]
    for c in candidates:
        if (c / MODEL_FILE).is_file() or (c / HF_TOKENIZER).is_file():
            return c.resolve()
    raise UserError(f"--tokenizer {name_or_path}: no {MODEL_FILE} or {HF_TOKENIZER} in "
                    f"{' or '.join(map(str, candidates))}; build one with `llmkit tokenizer` or give its folder")
