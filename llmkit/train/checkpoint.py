"""Checkpoint runs: `step-%08d/` folders that count only once their `complete` marker exists, and
a `latest` file naming the newest complete one.

A step folder holds `model.safetensors` (consolidated weights, tied matrices stored once),
`config.json` (model config), `trainer_state.json` (step, tokens seen, per-rank data position
and RNG states, metrics), a copy of the tokenizer, and `ds/` (DeepSpeed's optimizer / ZeRO
shards, for exact resume). Everything here reads safetensors and JSON; DeepSpeed's own `.pt`
files are read through `safe_torch_load`, never with the full unpickler.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import random
import re
import shutil
from pathlib import Path

from llmkit.errors import UserError
from llmkit.workspace import write_atomic

log = logging.getLogger("llmkit.train")

STEP_DIR = re.compile(r"^step-(\d{8,})$")
COMPLETE = "complete"
LATEST = "latest"
WEIGHTS = "model.safetensors"
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
    problem = weights_problem(step_dir / WEIGHTS)
    if problem:
        return problem
    ds = step_dir / DEEPSPEED
    if not ds.is_dir() or not any(p.name.endswith("model_states.pt") for p in ds.rglob("*")):
        return f"{DEEPSPEED}/ has no DeepSpeed model states"
    return None


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


def find_resume_checkpoint(run_dir: Path, resume_from: str | None = None) -> Path | None:
    return next(iter(resume_candidates(run_dir, resume_from)), None)


def mark_complete(step_dir: Path) -> None:
    """Seal a fully written step folder and point `latest` at it (the last two writes of a save)."""
    step_dir = Path(step_dir)
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

RUN_FINGERPRINT = "run_fingerprint"  # file in a run dir: the fingerprint of the run it holds


def open_run(ctx, stage: str, cfg, inputs: list):
    """(Builder of a checkpoint run, whether its directory holds a run to resume): a run of the
    same fingerprint that did not finish resumes; anything else is cleared by `start_run`."""
    import dataclasses

    from llmkit.workspace import MANIFEST

    # resume_from picks where a run continues; it must not make it look like another run
    cfg = dataclasses.replace(cfg, resume_from=None)
    b = ctx.workspace.builder(ctx.out_name(stage), stage=stage, config=cfg, inputs=inputs,
                              force=ctx.force, in_place=True)
    marker = b.final / RUN_FINGERPRINT
    resumable = (marker.is_file() and marker.read_text().strip() == b.fingerprint
                 and not (b.final / MANIFEST).exists())
    return b, resumable


def start_run(b, resumable: bool) -> None:
    """Inside `with b:` — clear a run dir that holds another (or a finished) run, mark ours."""
    if not resumable:
        for p in b.dir.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    (b.dir / RUN_FINGERPRINT).write_text(b.fingerprint + "\n")


@contextlib.contextmanager
def training_run(b, resumable: bool):
    """Every process of a training run enters this: the main one holds the builder (lock,
    manifest written on success) and clears or keeps the run dir (`start_run`) before the
    others go on. Yields the process's DistEnv."""
    from llmkit.train.distributed import barrier, setup_distributed

    dist = setup_distributed()
    if not dist.is_main:
        barrier()
        yield dist
        return
    with b:
        start_run(b, resumable)
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
    if (path / WEIGHTS).is_file():
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
