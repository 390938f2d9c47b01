"""Checkpoint runs: `step-%08d/` folders that count only once their `complete` marker exists, and
a `latest` file naming the newest complete one.

A step folder holds `model.safetensors` (consolidated weights, tied matrices stored once),
`config.json` (model config), `trainer_state.json` (step, tokens seen, per-rank data position
and RNG states, metrics), a copy of the tokenizer, and `ds/` (DeepSpeed's optimizer / ZeRO
shards, for exact resume). A LoRA run's step folder holds the adapters in peft's format instead
of the weights (`llmkit.train.lora`). Everything here reads safetensors and JSON; DeepSpeed's own `.pt`
files are read through `safe_torch_load`, never with the full unpickler.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import random
import re
import shutil
from pathlib import Path

from llmkit.errors import ConfigError, UserError
from llmkit.workspace import kill_point, write_atomic

log = logging.getLogger("llmkit.train")

STEP_DIR = re.compile(r"^step-(\d{8,})$")
COMPLETE = "complete"
LATEST = "latest"
WEIGHTS = "model.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # a LoRA run's step folders: peft's file names
ADAPTER_CONFIG = "adapter_config.json"
MODEL_CONFIG = "config.json"
TRAINER_STATE = "trainer_state.json"
TOKENIZER = "tokenizer"
DEEPSPEED = "ds"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of(path: Path) -> int | None:
    m = STEP_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


def step_dirs(run_dir: Path) -> list[Path]:
    """Every step folder of a run (complete or not), oldest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted((p for p in run_dir.iterdir() if p.is_dir() and step_of(p) is not None), key=step_of)


def is_complete(step_dir: Path) -> bool:
    return (Path(step_dir) / COMPLETE).is_file()


def checkpoint_problem(step_dir: Path) -> str | None:
    """Why a step folder cannot be resumed from, or None when it looks whole."""
    step_dir = Path(step_dir)
    if not is_complete(step_dir):
        return f"no '{COMPLETE}' marker (the save was interrupted)"
    try:
        json.loads((step_dir / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"{TRAINER_STATE} unreadable: {e}"
    problem = weights_problem(weights_file(step_dir))
    if problem:
        return problem
    ds = step_dir / DEEPSPEED
    if not ds.is_dir() or not any(p.name.endswith("model_states.pt") for p in ds.rglob("*")):
        return f"{DEEPSPEED}/ has no DeepSpeed model states"
    return None


def weights_file(step_dir) -> Path:
    """The weights a step folder holds: model.safetensors, or a LoRA run's adapters."""
    adapters = Path(step_dir) / ADAPTER_WEIGHTS
    return adapters if adapters.is_file() and not (Path(step_dir) / WEIGHTS).is_file() else Path(step_dir) / WEIGHTS


def weights_problem(path: Path) -> str | None:
    """Header and size check of a safetensors file (catches truncation without reading the data)."""
    try:
        with open(path, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(header_len))
        size = path.stat().st_size
    except (OSError, ValueError) as e:
        return f"{path.name} unreadable: {e}"
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if size != 8 + header_len + end:
        return f"{path.name} is truncated or padded ({size} bytes, header says {8 + header_len + end})"
    return None


def resume_candidates(run_dir: Path, resume_from: str | None = None):
    """Step folders to resume from, best first: `resume_from` alone if given, else every whole
    folder newest first. Incomplete or damaged folders are skipped with a warning naming the problem.
    """
    run_dir = Path(run_dir)
    if resume_from is not None:
        candidate = run_dir / resume_from
        problem = checkpoint_problem(candidate) if candidate.is_dir() else "it does not exist"
        if problem:
            raise UserError(f"cannot resume from {candidate}: {problem}; pick another step-* folder "
                            f"of {run_dir} or drop resume_from")
        yield candidate
        return
    for candidate in reversed(step_dirs(run_dir)):
        problem = checkpoint_problem(candidate)
        if problem is None:
            yield candidate
        else:
            log.warning("skipping checkpoint %s: %s", candidate, problem)


def mark_complete(step_dir: Path) -> None:
    """Seal a fully written step folder and point `latest` at it (the last two writes of a save)."""
    step_dir = Path(step_dir)
    kill_point("checkpoint")
    write_atomic(step_dir / COMPLETE, "")
    write_atomic(step_dir.parent / LATEST, step_dir.name + "\n")


def read_latest(run_dir: Path) -> str | None:
    try:
        return (Path(run_dir) / LATEST).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def prune_checkpoints(run_dir: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` complete folders, and incomplete folders older than
    the newest complete one (debris of killed saves). keep_last=0 keeps everything."""
    folders = step_dirs(run_dir)
    complete = [p for p in folders if is_complete(p)]
    if not complete:
        return []
    newest = step_of(complete[-1])
    doomed = [p for p in folders if not is_complete(p) and step_of(p) < newest]
    if keep_last > 0:
        doomed += complete[:-keep_last]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


# -- the run folder as a workspace artifact ----------------------------------------------------
#
# A complete checkpoint is never deleted without --force: running again with changed settings
# continues the run when only the settings in `TrainConfig.CONTINUABLE` changed (how far and how
# fast it goes on), and is refused, naming the keys, when anything that makes it another run
# changed (model, data, tokenizer, batch shape). --force starts the run over, or, with
# resume_from naming an older step, rewinds it there (the later checkpoints are replaced).

RUN_RECORD = "run.json"  # in a run dir: the settings and inputs it was last started with
LEGACY_RUN_FINGERPRINT = "run_fingerprint"  # what earlier versions kept instead of run.json


@dataclasses.dataclass
class RunPlan:
    """What a (re)start does with its run folder."""

    resume: bool  # continue the checkpoints in the folder (False: clear it and start fresh)
    step: int | None = None  # the step it continues from
    rewound: list = dataclasses.field(default_factory=list)  # later checkpoints it retrains (--force)
    changes: dict = dataclasses.field(default_factory=dict)  # {key: [old, new]} of this restart
    history: list = dataclasses.field(default_factory=list)  # every earlier restart's changes

    @property
    def change_record(self) -> dict:
        return {"step": self.step, "changes": self.changes}


def open_run(ctx, stage: str, cfg, inputs: list):
    """(Builder of a checkpoint run, its RunPlan); the plan is None when the run is up to date.
    Raises ConfigError, before anything is touched, when the folder holds another run."""
    # resume_from picks where a run continues; it must not make it look like another run
    b = ctx.workspace.builder(ctx.out_name(stage), stage=stage,
                              config=dataclasses.replace(cfg, resume_from=None), inputs=inputs,
                              force=ctx.force, in_place=True)
    if b.up_to_date:
        return b, None
    defaults = _flat(dataclasses.asdict(type(cfg)()))
    return b, plan_run(b, cfg.resume_from, type(cfg).CONTINUABLE, ctx.force, defaults)


def plan_run(b, resume_from: str | None, continuable: frozenset, force: bool,
             defaults: dict | None = None) -> RunPlan:
    """Continue, rewind (resume_from an older step, with --force) or start fresh; see above.
    A setting the run's record lacks (one a later llmkit added, such as lora.r or model.head_dim)
    is unchanged while it has its default in `defaults` (flat keys): it is what the run had. One
    the record has and this llmkit no longer has (ppo's top_k) cannot have been set now: no change."""
    complete = [p for p in step_dirs(b.final) if is_complete(p)]
    if not complete or (force and not resume_from):
        return RunPlan(resume=False)
    record = _read_run_record(b.final)
    if record is None:
        legacy = b.final / LEGACY_RUN_FINGERPRINT
        if legacy.is_file() and legacy.read_text().strip() == b.fingerprint:
            record = {"config": b.config, "inputs": _input_record(b)}
        else:
            raise _another_run(b, ["(unknown: the folder does not record its settings)"])
    old, new = _flat(record["config"]), _flat(b.config)
    defaults = defaults or {}
    added = {k for k in new.keys() - old.keys() if k in defaults and new[k] == defaults[k]}
    changed = sorted(k for k in new.keys() - added if old.get(k) != new.get(k))
    fixed = [k for k in changed if k.split(".")[0] not in continuable]
    # inputs compare by fingerprint, in order: a copied or moved workspace is the same run
    old_inputs = [i["fingerprint"] for i in record["inputs"]]
    fixed += [f"input {a.path}" for n, a in enumerate(b.inputs)
              if n >= len(old_inputs) or old_inputs[n] != a.fingerprint]
    if fixed:
        raise _another_run(b, fixed)
    start = b.final / resume_from if resume_from else complete[-1]
    if start not in complete:
        names = ", ".join(p.name for p in complete)
        raise ConfigError(f"cannot resume from {start}: it is not a complete checkpoint of {b.final} "
                          f"(complete: {names}); pick one of those or drop resume_from")
    step = step_of(start)
    if new["max_steps"] < step:
        raise ConfigError(f"{b.final} is at step {step}, past max_steps={new['max_steps']}; raise "
                          f"max_steps, or rewind with resume_from=step-… and --force")
    later = [p for p in complete if step_of(p) > step]
    if later and not force:
        raise ConfigError(f"resume_from={start.name} rewinds {b.final}: its later checkpoints "
                          f"({', '.join(p.name for p in later)}) would be retrained and replaced. Add "
                          f"--force to rewind, or branch off with --out NEW --from {start}")
    return RunPlan(True, step, later, {k: [old.get(k), new.get(k)] for k in changed},
                   record.get("changes", []))


def start_run(b, plan: RunPlan) -> None:
    """Inside `with b:` — clear the run dir for a fresh run, or record a restart's changed
    settings (run.json, the manifest, and a `config_change` event in metrics.jsonl)."""
    from llmkit.train.metrics import METRICS_FILE

    history = plan.history
    if not plan.resume:
        for p in b.dir.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    if plan.rewound:  # one history per run folder: the abandoned branch's checkpoints go
        for p in plan.rewound:
            shutil.rmtree(p)
        write_atomic(b.dir / LATEST, step_dir_name(plan.step) + "\n")
        print(f"{b.name}: rewound to step {plan.step}; removed {', '.join(p.name for p in plan.rewound)}")
    if plan.changes:
        history = [*history, plan.change_record]
        with open(b.dir / METRICS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": "config_change", **plan.change_record}) + "\n")
        print(f"{b.name}: continuing from step {plan.step} with " +
              ", ".join(f"{k} {old} -> {new}" for k, (old, new) in plan.changes.items()))
    if history:
        b.extra["config_changes"] = history
    (b.dir / LEGACY_RUN_FINGERPRINT).unlink(missing_ok=True)
    write_atomic(b.dir / RUN_RECORD, json.dumps(
        {"config": b.config, "inputs": _input_record(b), "changes": history}, indent=2, default=str))


def _read_run_record(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / RUN_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _input_record(b) -> list[dict]:
    return [{"path": str(a.path), "fingerprint": a.fingerprint} for a in b.inputs]


def _flat(config: dict, prefix: str = "") -> dict:
    """{"model.hidden_size": 32, ...}: nested sections as dotted keys, as --set spells them."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _another_run(b, keys: list[str]) -> ConfigError:
    shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
    return ConfigError(
        f"{b.final} holds a run trained with other settings ({shown}); those cannot change within "
        f"a run. Train a new one with --out NEW (--from {b.name} starts it from these weights), "
        f"start this one over with --force (its checkpoints are deleted), or put the settings back")


@contextlib.contextmanager
def training_run(b, plan: RunPlan):
    """Every process of a training run enters this: the main one holds the builder (lock,
    manifest written on success) and starts the run dir (`start_run`) before the others go on.
    Yields the process's DistEnv."""
    from llmkit.train.distributed import barrier, setup_distributed

    dist = setup_distributed()
    if not dist.is_main:
        barrier()
        yield dist
        return
    with b:
        start_run(b, plan)
        barrier()
        yield dist


# -- DeepSpeed's pickles ---------------------------------------------------------------------

# DeepSpeed reads its states back with torch.load(weights_only=False), which would run any code
# planted in a checkpoint folder. The engine swaps in `safe_torch_load`: torch's weights-only
# unpickler, allowing just the DeepSpeed types that its states hold (found by
# torch.serialization.get_unsafe_globals_in_checkpoint on ZeRO 0-3 fp32 and bf16 saves; fp16
# saves add the dynamic loss scaler).
DEEPSPEED_STATE_TYPES = (
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)


def safe_torch_load(path, map_location=None):
    """torch.load for DeepSpeed state files: tensors, containers and the DeepSpeed types above.
    A file that names any other global is refused with a UserError (nothing of it runs); a file
    that is merely damaged raises torch's error, so the caller can fall back to an older step."""
    import importlib
    import pickle

    import torch

    allowed = [getattr(importlib.import_module(module), name) for module, name in DEEPSPEED_STATE_TYPES]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as refused:
        try:
            named = torch.serialization.get_unsafe_globals_in_checkpoint(path)  # reads, never runs
        except Exception:
            raise refused from None  # not a readable checkpoint at all: damaged
        foreign = sorted(set(named) - {f"{module}.{name}" for module, name in DEEPSPEED_STATE_TYPES})
        if not foreign:
            raise
        raise UserError(f"refusing to load {path}: it asks to run {', '.join(foreign[:3])}, which is not "
                        "tensor or DeepSpeed state; it was not written by llmkit. Delete that step folder, "
                        "or resume from another one (resume_from=step-...)") from None


# -- weights -------------------------------------------------------------------------------


def tied_groups(state_dict_keep_vars: dict) -> dict[str, str]:
    """{alias: kept_name} for entries that are the same tensor (tied weights); the first name is kept,
    as transformers does (embed_tokens kept, lm_head dropped)."""
    first: dict[int, str] = {}
    tied = {}
    for name, tensor in state_dict_keep_vars.items():
        if id(tensor) in first:
            tied[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
    return tied


def save_weights(path: Path, tensors: dict, tied: dict[str, str]) -> None:
    """Write a safetensors file with each tied matrix once; the aliases go in its metadata."""
    from safetensors.torch import save_file

    unique = {k: v.detach().contiguous() for k, v in tensors.items() if k not in tied}
    save_file(unique, str(path), metadata={"format": "pt", "tied": json.dumps(tied)})


def read_weights(path: Path) -> dict:
    """A state_dict from a safetensors file, tied aliases restored (sharing one tensor)."""
    from safetensors import safe_open

    sd = {}
    with safe_open(str(path), framework="pt") as f:
        tied = json.loads((f.metadata() or {}).get("tied", "{}"))
        for key in f.keys():
            sd[key] = f.get_tensor(key)
    for alias, kept in tied.items():
        sd[alias] = sd[kept]
    return sd


def resolve_step_dir(path: str | Path) -> Path:
    """A step folder from a step folder, or a run folder (its `latest`, else its newest complete)."""
    path = Path(path)
    if weights_file(path).is_file():
        return path
    if not path.is_dir():
        raise UserError(f"{path} does not exist; give a checkpoint run or one of its step-* folders")
    latest = read_latest(path)
    if latest and is_complete(path / latest):
        return path / latest
    complete = [p for p in step_dirs(path) if is_complete(p)]
    if complete:
        return complete[-1]
    raise UserError(f"{path} holds no complete checkpoint (no {WEIGHTS}, no complete step-* folder); "
                    "train it first or give a step folder")


def load_weights(path: str | Path) -> tuple[dict, dict]:
    """(state_dict, model_config_dict) of a checkpoint: a run folder (its latest) or a step folder."""
    step_dir = resolve_step_dir(path)
    problem = weights_problem(step_dir / WEIGHTS)
    if problem:
        raise UserError(f"{step_dir}: {problem}")
    try:
        config = json.loads((step_dir / MODEL_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{step_dir / MODEL_CONFIG} unreadable ({e}); the checkpoint is damaged") from None
    return read_weights(step_dir / WEIGHTS), config


# -- RNG states as JSON (no pickles) ------------------------------------------------------------


def rng_state() -> dict:
    """This process's python / numpy / torch (CPU + CUDA) generator states, JSON-serialisable."""
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    import numpy as np
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


def _b64(t) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str):
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def to_json_safe(obj):
    """Numpy scalars/arrays and tensors -> plain values, for data-loader states in JSON."""
    import numpy as np

    if isinstance(obj, dict):
        return {str(k): to_json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # a torch tensor
        return obj.tolist()
    return obj
