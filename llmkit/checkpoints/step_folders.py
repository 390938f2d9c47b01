"""The step-folder format of checkpoint runs: `step-%08d/` folders that count only once their
`complete` marker exists, a `latest` file naming the newest complete one, and the weights they
hold. Whatever reads or writes a checkpoint (train, eval, hf, status, generation, the API, data)
does it here; a run's lifecycle (continue, rewind, start over: `run.json`) is
`llmkit.train.checkpoint`.

A step folder holds `model.safetensors` (consolidated weights, tied matrices stored once),
`config.json` (model config), `trainer_state.json` (step, tokens seen, per-rank data position
and RNG states, metrics), a copy of the tokenizer, and `ds/` (DeepSpeed's optimizer / ZeRO
shards, for exact resume). A LoRA run's step folder holds the adapters in peft's format instead
of the weights (`llmkit.checkpoints.lora`). Everything here reads safetensors and JSON; DeepSpeed's own `.pt`
files are read through `safe_torch_load`, never with the full unpickler.
"""

from __future__ import annotations

import base64
import importlib
import json
import logging
import pickle
import random
import re
import shutil
from pathlib import Path

from llmkit.errors import UserError
from llmkit.tokenizers.sentencepiece import tokenizer_file
from llmkit.core.durable import kill_point, write_atomic

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
    sort_metadata(path)


def sort_metadata(path: Path) -> None:
    """Put a safetensors header's metadata keys in sorted order, in place: safetensors writes
    them in its hash map's order, which changes from process to process, so two runs computing
    the same weights would write different bytes. The sorted header has the same length."""
    with open(path, "r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        raw = f.read(size)
        header = json.loads(raw)
        if len(header.get("__metadata__") or {}) < 2:
            return
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(text) <= size and raw.rstrip(b" ") != text:  # the writer pads with spaces
            f.seek(8)
            f.write(text.ljust(size, b" "))


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


def tokenizer_folder(path) -> Path:
    """A tokenizer folder: `path` itself when it holds a tokenizer (`llmkit tokenizer`'s artifact, a
    model's folder), else the copy a checkpoint run (its latest step) or step folder carries, so an
    imported model's tokenizer is named by its run (`tokenize --tokenizer imported`)."""
    path = Path(path)
    if tokenizer_file(path) is not None:
        return path
    if (path / TOKENIZER).is_dir() or step_dirs(path):
        return checkpoint_step_dir(path) / TOKENIZER
    return path  # not a tokenizer: open_tokenizer says what one needs


def checkpoint_step_dir(path) -> Path:
    """The step folder `path` names: itself, or a run's `latest` (else newest complete) step."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path} does not exist; give a checkpoint run (a folder of step-* folders) or "
                        "one of its step-* folders")
    if step_of(path) is not None and not is_complete(path):
        raise UserError(f"{path} has no 'complete' marker: its save was interrupted; use another step "
                        f"of {path.parent} or the run folder itself")
    if step_of(path) is None and not weights_file(path).is_file():
        started = step_dirs(path)
        if started and not any(is_complete(p) for p in started):
            raise UserError(f"{path} holds no complete checkpoint yet ({len(started)} interrupted save(s)); "
                            "resume training with the same command to write one")
    return resolve_step_dir(path)


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
