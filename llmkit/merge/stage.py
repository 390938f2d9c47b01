"""`llmkit merge`: runs or imported models of one shape and one tokenizer -> a checkpoint run with one
complete step folder, `step-00000000/`, as `llmkit import` writes, that every stage reads with --from.

Methods (llmkit.merge.methods, mergekit 0.1.5's definitions and defaults): linear (Model Soups),
slerp (two models, t from the base), task_arithmetic, ties, dare_ties, dare_linear (on the task
vectors of --from against --base), and average: the mean of one run's last K complete step folders
(a checkpoint soup of a single run). A LoRA run counts as its merged weights (base + adapters), so
LoRA runs of one base merge with each other, with full fine-tunes and with the base itself.

Every input is checked before anything is written (its model config, its tokenizer's vocabulary); the
manifest records the method, each input with its step folder and fingerprint, and the weights,
densities, t and seed used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from llmkit.checkpoints import step_folders as ckpt
from llmkit.checkpoints.loading import check_language_model, load_model, model_config_from, starting_weights
from llmkit.checkpoints.lora_files import holds_adapters, read_config
from llmkit.core.fingerprints import config_defaults
from llmkit.core.progress import print_summary
from llmkit.errors import ConfigError, UserError
from llmkit.tokenizers.base import JSON_FILE, MODEL_FILE
from llmkit.merge.methods import gradient_value, linear, slerp, task_arithmetic

# method -> (sparsification, sign consensus, normalize by default, rescale by default): mergekit's registry
TASK_VECTOR_METHODS = {"task_arithmetic": (None, False, False, False), "ties": ("magnitude", True, True, False),
                       "dare_ties": ("random", True, False, True), "dare_linear": ("random", False, False, True)}
METHODS = ("linear", "slerp", *TASK_VECTOR_METHODS, "average")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class MergeConfig:
    method: str = "linear"  # linear | slerp | task_arithmetic | ties | dare_ties | dare_linear | average (--method)
    weights: list[float] | None = None  # one per model merged (linear: each --from; others: each non-base); default 1 each
    density: float | list[float] = 1.0  # ties / dare: share of each task vector kept, in (0, 1]; one, or one per model
    t: float | list[float] = 0.5  # slerp: 0 is the base, 1 the other model; a list is a gradient over the layers
    normalize: bool | None = None  # divide by the sum of the weights; default: the method's (linear, ties: true)
    rescale: bool | None = None  # dare: scale each kept task vector back to its L1 norm; default true for dare
    scale: float = 1.0  # task-vector methods: multiplies the merged task vector (mergekit's lambda)
    seed: int = 0  # dare's random masks (the stream mergekit draws with random_seed)
    last: int = 3  # average: the run's last K complete step folders
    dtype: str = "auto"  # stored weights: auto (the base's, else the first model's), float32, bfloat16, float16

    def __post_init__(self):
        if self.method not in METHODS:
            raise ConfigError(f"merge method {self.method!r} is unknown; use one of {', '.join(METHODS)}")
        densities = self.density if isinstance(self.density, list) else [self.density]
        for d in densities:
            if not 0 < d <= 1:
                raise ConfigError(f"merge density must be in (0, 1], got {d}")
        if self.last < 1:
            raise ConfigError(f"merge last must be >= 1, got {self.last}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"merge dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.weights is not None and not self.weights:
            raise ConfigError("merge weights is empty; give one weight per model, or leave it out")


@dataclass
class Source:
    """One model merged: what the user named, its artifact and the step folder read."""
    name: str
    artifact: object
    step_dir: Path

    def record(self) -> dict:
        return {"name": self.name, "step": self.step_dir.name, "fingerprint": self.artifact.fingerprint,
                "lora": holds_adapters(self.step_dir)}


def run_merge(ctx, cfg: MergeConfig, from_: list[str], base: str | None = None):
    """`llmkit merge --from A,B --method M [--base BASE]`: checkpoint run `ctx.out` (default "merged")."""
    sources, base_source = plan_inputs(ctx.workspace, cfg, from_, base)
    every = ([base_source] if base_source else []) + sources
    check_compatible(every)
    weights = resolved_weights(cfg, sources)
    densities = per_model(cfg.density, len(sources), "density", cfg.method != "linear")
    record = {"method": cfg.method, "inputs": [s.record() for s in sources],
              "base": base_source.record() if base_source else None, "weights": weights}
    if cfg.method == "linear":
        record.update(normalize=cfg.normalize is not False)
    if cfg.method in TASK_VECTOR_METHODS:
        sparsify, _, normalize, rescale = TASK_VECTOR_METHODS[cfg.method]
        record.update(density=densities if sparsify else None, seed=cfg.seed if sparsify == "random" else None,
                      normalize=normalize if cfg.normalize is None else cfg.normalize, scale=cfg.scale,
                      rescale=(rescale if cfg.rescale is None else cfg.rescale) if sparsify else None)
    elif cfg.method == "slerp":
        record.update(t=cfg.t)
    artifacts = list({str(s.artifact.path.resolve()): s.artifact for s in every}.values())
    b = ctx.workspace.builder(ctx.out_name("merged"), stage="merge", config={**dataclasses.asdict(cfg),
                              "steps": [[s.name, s.step_dir.name] for s in every]}, inputs=artifacts, force=ctx.force,
                              defaults=config_defaults(cfg))
    if b.up_to_date:
        return b
    with b:
        b.stats.update(record, **write_merged_run(sources, base_source, weights, densities, cfg, b.dir))
    print_summary(f"merge done: {b.final}", [
        ("method", cfg.method), ("inputs", ", ".join(f"{s.name}/{s.step_dir.name}" for s in sources)),
        ("base", base_source.name if base_source else "-"), ("weights", weights),
        ("parameters", b.stats["parameters"]), ("seconds", round(time.time() - b.started, 1))])
    return b


def plan_inputs(workspace, cfg: MergeConfig, from_: list[str], base: str | None) -> tuple[list[Source], Source | None]:
    """(the models merged, the base or None), checked against what the method takes."""
    names = [n.strip() for item in from_ for n in item.split(",") if n.strip()]
    if not names:
        raise UserError("merge needs --from: the models to merge, comma-separated (--from A,B)")
    if cfg.method == "average":
        if len(names) != 1 or base:
            raise UserError(f"merge --method average averages one run's last step folders: give one --from RUN "
                            f"(got --from {','.join(names)}{' and --base ' + base if base else ''})")
        return last_steps(workspace, names[0], cfg.last), None
    if cfg.method == "linear":
        if base:
            raise UserError(f"merge --method linear takes no --base (it averages the --from models); add {base} to "
                            "--from to include it, or use task_arithmetic for task vectors against a base")
        if len(names) < 2:
            raise UserError(f"merge --method linear needs two or more --from models, got {','.join(names)}")
        return [source(workspace, n) for n in names], None
    if not base:
        raise UserError(f"merge --method {cfg.method} needs --base: the model the others were fine-tuned from")
    base_source = source(workspace, base)
    others = [source(workspace, n) for n in names]
    others = [s for s in others if s.step_dir.resolve() != base_source.step_dir.resolve()]  # mergekit's models list holds the base
    if cfg.method == "slerp" and len(others) != 1:
        raise UserError(f"merge --method slerp interpolates the base and one other model; --from names "
                        f"{len(others)} besides --base {base}")
    if not others:
        raise UserError(f"merge --method {cfg.method}: --from names no model besides --base {base}")
    return others, base_source


def source(workspace, name: str) -> Source:
    art, step_dir = starting_weights(workspace, name)
    return Source(name, art, Path(step_dir))


def last_steps(workspace, name: str, k: int) -> list[Source]:
    art, _ = starting_weights(workspace, name)
    complete = [p for p in ckpt.step_dirs(art.path) if ckpt.is_complete(p)]
    if len(complete) < k:
        raise UserError(f"{art.path} has {len(complete)} complete step folder(s) "
                        f"({', '.join(p.name for p in complete) or 'none'}); merge last={k} needs {k}: lower last, "
                        "or raise the run's keep_last and save more often (save_every)")
    return [Source(name, art, p) for p in complete[-k:]]


def check_compatible(sources: list[Source]) -> None:
    """A UserError naming the input whose model config or tokenizer differs from the first's."""
    first = sources[0]
    shape = model_shape(first.step_dir)
    vocab = tokenizer_digest(first.step_dir)
    for other in sources[1:]:
        theirs = model_shape(other.step_dir)
        differ = [k for k in shape if shape[k] != theirs.get(k)]
        if differ:
            diffs = ", ".join(f"{k} {shape[k]!r} vs {theirs.get(k)!r}" for k in differ[:4])
            raise UserError(f"cannot merge {other.name} ({other.step_dir}) with {first.name}: their models differ "
                            f"({diffs}); merge models of one family and shape")
        if tokenizer_digest(other.step_dir) != vocab:
            raise UserError(f"cannot merge {other.name} ({other.step_dir}) with {first.name}: their tokenizers differ "
                            f"({other.step_dir / ckpt.TOKENIZER} vs {first.step_dir / ckpt.TOKENIZER}); a token id "
                            "would mean different text in each, so their embedding rows do not correspond")


def model_shape(step_dir: Path) -> dict:
    config = read_config(step_dir)
    if not holds_adapters(step_dir):
        check_language_model(config, step_dir)
    return dataclasses.asdict(model_config_from(config, step_dir))


def tokenizer_digest(step_dir: Path) -> str:
    """A hash of the vocabulary a step folder's tokenizer carries (sentencepiece's model file, or
    tokenizer.json's pieces, merges and added tokens): a chat template or special-token names added
    by fine-tuning do not change which text an id means."""
    folder = step_dir / ckpt.TOKENIZER
    if (folder / MODEL_FILE).is_file():
        return hashlib.sha256((folder / MODEL_FILE).read_bytes()).hexdigest()
    if not (folder / JSON_FILE).is_file():
        raise UserError(f"{step_dir} has no {ckpt.TOKENIZER}/ folder with {MODEL_FILE} or {JSON_FILE}; merge needs "
                        "the tokenizer each model reads")
    data = json.loads((folder / JSON_FILE).read_text(encoding="utf-8"))
    return hashlib.sha256(json.dumps([data.get("model"), data.get("added_tokens")], sort_keys=True).encode()).hexdigest()


def resolved_weights(cfg: MergeConfig, sources: list[Source]) -> list[float] | None:
    if cfg.method in ("slerp", "average"):
        if cfg.weights is not None:
            raise UserError(f"merge --method {cfg.method} takes no weights ("
                            f"{'t sets the mix: --set t=0.3' if cfg.method == 'slerp' else 'every step counts the same'})")
        return None
    return per_model(cfg.weights if cfg.weights is not None else 1.0, len(sources), "weights", cfg.method != "linear")


def per_model(value, n: int, key: str, besides_base: bool = True) -> list[float]:
    if not isinstance(value, list):
        return [float(value)] * n
    if len(value) != n:
        raise UserError(f"merge {key} has {len(value)} value(s) ({','.join(map(str, value))}) for {n} model(s) "
                        f"merged{' besides --base' if besides_base else ''}; give one per model")
    return [float(v) for v in value]


def state_of(step_dir: Path) -> dict:
    """The weights of a step folder: the file's tensors, or a LoRA run's base with its adapters merged."""
    if holds_adapters(step_dir):
        return load_model(step_dir)[0].state_dict()
    return ckpt.load_weights(step_dir)[0]


def layer_position(name: str, n_layers: int) -> float:
    """Where a tensor sits for a gradient: layer i of n at i / (n - 1); anything outside the layers at 0."""
    parts = name.split(".")
    if "layers" in parts and parts.index("layers") + 1 < len(parts) and parts[parts.index("layers") + 1].isdigit():
        i = int(parts[parts.index("layers") + 1])
        return i / (n_layers - 1) if n_layers > 1 else 1.0
    return 0.0


def merged_tensors(states: list[dict], base: dict | None, weights, densities, cfg: MergeConfig, n_layers: int,
                   names: list[str]) -> dict:
    """name -> merged float32 tensor, for `names` in sorted order (the order mergekit draws DARE's masks in)."""
    import torch

    generator = torch.Generator().manual_seed(cfg.seed)
    out = {}
    for name in sorted(names):
        tensors = [s[name] for s in states]
        if not tensors[0].is_floating_point():
            out[name] = (base or states[0])[name]
        elif cfg.method == "linear":
            out[name] = linear(tensors, weights, normalize=cfg.normalize is not False)
        elif cfg.method == "average":
            out[name] = linear(tensors, [1.0] * len(tensors))
        elif cfg.method == "slerp":
            out[name] = slerp(gradient_value(cfg.t, layer_position(name, n_layers)), base[name], tensors[0])
        else:
            sparsify, consensus, normalize, rescale = TASK_VECTOR_METHODS[cfg.method]
            out[name] = task_arithmetic(
                base[name], tensors, weights, sparsify=sparsify, densities=densities, consensus=consensus,
                normalize=normalize if cfg.normalize is None else cfg.normalize,
                rescale=rescale if cfg.rescale is None else cfg.rescale, scale=cfg.scale, generator=generator)
    return out


def write_merged_run(sources: list[Source], base: Source | None, weights, densities, cfg: MergeConfig,
                     run_dir: Path) -> dict:
    """`run_dir/step-00000000/` (weights, config.json, trainer_state.json, tokenizer/, complete) and
    `run_dir/latest`; returns counts for the manifest."""
    import torch

    reference = base or sources[0]
    config = model_config_from(read_config(reference.step_dir), reference.step_dir)
    tied = {"lm_head.weight": "model.embed_tokens.weight"} if config.tie_embeddings else {}
    states = [state_of(s.step_dir) for s in sources]
    base_state = state_of(base.step_dir) if base else None
    names = [k for k in (base_state or states[0]) if k not in tied]
    merged = merged_tensors(states, base_state, weights, densities, cfg, config.n_layers, names)
    stored = (base_state or states[0])[names[0]].dtype if cfg.dtype == "auto" else getattr(torch, cfg.dtype)
    merged = {k: v.to(stored) if v.is_floating_point() else v for k, v in merged.items()}
    merged.update({alias: merged[kept] for alias, kept in tied.items()})
    step_dir = Path(run_dir) / ckpt.step_dir_name(0)
    step_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(reference.step_dir / ckpt.TOKENIZER, step_dir / ckpt.TOKENIZER)
    ckpt.save_weights(step_dir / ckpt.WEIGHTS, merged, tied)
    (step_dir / ckpt.MODEL_CONFIG).write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n", encoding="utf-8")
    (step_dir / ckpt.TRAINER_STATE).write_text(json.dumps(
        {"step": 0, "tokens_seen": 0, "merged_from": [f"{s.name}/{s.step_dir.name}" for s in sources]}) + "\n",
        encoding="utf-8")
    ckpt.mark_complete(step_dir)
    return {"parameters": sum(v.numel() for k, v in merged.items() if k not in tied),
            "dtype": str(stored).removeprefix("torch.")}
