"""`llmkit import`: a local Llama / Mistral / Mixtral transformers folder (safetensors, sharded or
not) -> a checkpoint run with one complete step folder, `step-00000000/`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from llmkit.errors import ConfigError, UserError
from llmkit.hf.folder import DTYPES, HF_CONFIG, SHARD_INDEX, read_json, write_json
from llmkit.hf.tokenizer import write_llmkit_tokenizer


@dataclass
class ImportConfig:
    dtype: str = "auto"  # weights stored as: auto (as in the transformers folder), float32, bfloat16, float16

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ConfigError(f"import dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")


def run_import(ctx, cfg: ImportConfig, source: str, tokenizer: str | None = None):
    """`llmkit import`: a transformers folder -> checkpoint run `ctx.out` (default "imported")."""
    from llmkit.progress import print_summary

    src = Path(source)
    if not (src / HF_CONFIG).is_file():
        raise UserError(f"{src} is not a transformers model folder (no {HF_CONFIG}); give the folder that "
                        "save_pretrained wrote")
    tokenizer_dir = _tokenizer_source(ctx.workspace, tokenizer) if tokenizer else None
    identity = {"source": str(src.resolve()), "tokenizer": str(tokenizer_dir) if tokenizer_dir else None,
                "files": {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(src.iterdir())
                          if p.is_file()}}
    b = ctx.workspace.builder(ctx.out_name("imported"), stage="import",
                              config={**dataclasses.asdict(cfg), **identity}, force=ctx.force)
    if b.up_to_date:
        return b
    with b:
        b.stats.update(import_hf(src, b.dir, cfg, tokenizer_dir))
    print_summary(f"import done: {b.final}", [(k, v) for k, v in b.stats.items()])
    return b


def import_hf(src: Path, run_dir: Path, cfg: ImportConfig, tokenizer_dir: Path | None = None) -> dict:
    """Write `run_dir/step-00000000/` (weights, config.json, trainer_state.json, tokenizer/,
    complete) and `run_dir/latest` from a transformers folder; returns counts for the manifest."""
    import torch

    from llmkit.hf.mapping import from_hf_config, from_hf_state_dict
    from llmkit.model import Transformer
    from llmkit.train import checkpoint as ckpt

    src = Path(src)
    hf_config = read_json(src / HF_CONFIG)
    try:
        model_config = from_hf_config(hf_config)
    except (ConfigError, KeyError) as e:
        raise UserError(f"{src / HF_CONFIG}: {e if isinstance(e, ConfigError) else f'missing key {e}'}; "
                        "llmkit imports Llama, Mistral and Mixtral models") from None
    state_dict = from_hf_state_dict(read_hf_weights(src), model_config)
    if cfg.dtype != "auto":
        state_dict = {k: v.to(getattr(torch, cfg.dtype)) for k, v in state_dict.items()}
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in Transformer(model_config).state_dict().items()}
    missing = sorted(set(shapes) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(shapes))
    wrong = [k for k in shapes if k in state_dict and tuple(state_dict[k].shape) != shapes[k]]
    if missing or unexpected or wrong:
        raise UserError(f"{src}: the weights do not fit {HF_CONFIG} (missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]}, wrong shape {wrong[:3]})")

    step_dir = Path(run_dir) / ckpt.step_dir_name(0)
    step_dir.mkdir(parents=True, exist_ok=True)
    tied = {"lm_head.weight": "model.embed_tokens.weight"} if model_config.tie_embeddings else {}
    ckpt.save_weights(step_dir / ckpt.WEIGHTS, state_dict, tied)
    write_json(step_dir / ckpt.MODEL_CONFIG, dataclasses.asdict(model_config))
    write_json(step_dir / ckpt.TRAINER_STATE, {"step": 0, "tokens_seen": 0, "imported_from": str(src)})
    tokenizer_vocab = write_llmkit_tokenizer(src, step_dir / ckpt.TOKENIZER, model_config.vocab_size, tokenizer_dir)
    ckpt.mark_complete(step_dir)
    n_params = sum(v.numel() for k, v in state_dict.items() if k not in tied)
    return {"architecture": (hf_config.get("architectures") or [hf_config["model_type"]])[0],
            "parameters": n_params, "vocab_size": model_config.vocab_size, "tokenizer_vocab": tokenizer_vocab,
            "dtype": str(next(iter(state_dict.values())).dtype).removeprefix("torch.")}


def read_hf_weights(src: Path) -> dict:
    """Every tensor of a transformers folder's safetensors files (one file, or shards listed in
    model.safetensors.index.json). Pickled .bin weights are refused: loading them runs code."""
    from llmkit.train.checkpoint import read_weights, weights_problem

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
        if (c / "tokenizer.model").is_file():
            return c.resolve()
    raise UserError(f"--tokenizer {name_or_path}: no tokenizer.model in {' or '.join(map(str, candidates))}; "
                    "build one with `llmkit tokenizer` or give its folder")
