"""LoRA step folders on disk: the adapter files as `peft.PeftModel.save_pretrained` writes them,
the base step folder they name (checked by the fingerprint of its weights), and the run's pinned
copy of that base (`RUN/base/`; see `llmkit.checkpoints.lora` for why a run pins it).

No torch and no peft here: `llmkit status` and loading read these folders before (or without)
building a model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from llmkit.checkpoints.step_folders import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, DEEPSPEED, MODEL_CONFIG, WEIGHTS,
                                is_complete, step_dirs, weights_file)
from llmkit.errors import UserError
from llmkit.checkpoints import new_rows
from llmkit.core.workspace import MANIFEST, Artifact
from llmkit.core.durable import link_or_copy, write_atomic

LORA_KEY = "llmkit_lora"  # the section of a LoRA step's config.json naming its base
PINNED_BASE = "base"  # in a LoRA run's folder: the step folder its adapters adapt, pinned
PEFT_PREFIX = "base_model.model."  # what PeftModel.save_pretrained puts before module names
ADAPTER_NAME = "default"  # peft's name of a model's one adapter


def weights_fingerprint(step_dir) -> str:
    """blake2b of a step folder's weights file: the base a LoRA checkpoint was trained on."""
    digest = hashlib.blake2b(digest_size=16)
    with open(weights_file(step_dir), "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


DORA_MAGNITUDE = "lora_magnitude_vector"


def peft_names(tensors: dict) -> dict:
    """llmkit's names of trained tensors -> the names in peft's adapter_model.safetensors
    (`base_model.model.<module>.lora_A.weight`: the adapter's name dropped; DoRA's magnitude
    `<module>.lora_magnitude_vector`, its `.weight` dropped too, as peft writes it)."""
    def peft_name(name: str) -> str:
        name = name.replace(f".{DORA_MAGNITUDE}.{ADAPTER_NAME}.weight", f".{DORA_MAGNITUDE}")
        return PEFT_PREFIX + re.sub(rf"\.(lora_\w+|{new_rows.DELTA})\.{ADAPTER_NAME}(?=\.|$)", r".\1", name)

    return {peft_name(name): t for name, t in tensors.items()}


def llmkit_names(tensors: dict) -> dict:
    """The inverse of `peft_names`."""
    def llmkit_name(name: str) -> str:
        name = re.sub(rf"\.{DORA_MAGNITUDE}$", f".{DORA_MAGNITUDE}.{ADAPTER_NAME}.weight", name)
        name = re.sub(rf"\.{new_rows.DELTA}$", f".{new_rows.DELTA}.{ADAPTER_NAME}", name)
        return re.sub(r"\.(lora_[AB])\.", rf".\1.{ADAPTER_NAME}.", name.removeprefix(PEFT_PREFIX))

    return {llmkit_name(name): t for name, t in tensors.items()}


def save_adapters(step_dir: Path, tensors: dict, adapters) -> None:
    """adapter_model.safetensors + adapter_config.json in `step_dir`, as peft writes them;
    `tensors` are the trained ones (adapters and heads trained in full), llmkit's names;
    `adapters` the model's `lora.Adapters`."""
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous() for k, v in peft_names(tensors).items()},
              str(step_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    write_adapter_config(adapters.peft_config, step_dir, base=os.path.relpath(adapters.base, step_dir))


def write_adapter_config(peft_config, folder: Path, base: str) -> None:
    """adapter_config.json as peft writes it, its target modules sorted (peft keeps a set, whose
    order changes from process to process: a resumed run would write another file)."""
    dataclasses.replace(peft_config, base_model_name_or_path=base).save_pretrained(str(folder))
    path = folder / ADAPTER_CONFIG
    config = json.loads(path.read_text(encoding="utf-8"))
    config["target_modules"] = sorted(config["target_modules"])
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def config_entry(step_dir: Path, adapters) -> dict:
    """What a step folder's config.json adds when it holds adapters (`lora.Adapters`, or None):
    its base and fingerprint."""
    if adapters is None:
        return {}
    entry = {"base": os.path.relpath(adapters.base, step_dir), "base_fingerprint": adapters.base_fingerprint}
    if adapters.quant != "none":
        entry.update(quant=adapters.quant, double_quant=adapters.double_quant)
    return {LORA_KEY: entry}


def holds_adapters(step_dir) -> bool:
    """Whether a step folder holds LoRA adapters (instead of full weights)."""
    return (Path(step_dir) / ADAPTER_CONFIG).is_file() and not (Path(step_dir) / WEIGHTS).is_file()


def base_of(step_dir, config: dict | None = None) -> Path:
    """The base step folder of a LoRA step folder, checked: it exists and its weights are the
    ones the adapters were trained on (a UserError otherwise)."""
    step_dir = Path(step_dir)
    if config is None:
        config = read_config(step_dir)
    entry = config.get(LORA_KEY)
    if not entry:
        raise UserError(f"{step_dir / MODEL_CONFIG} names no base model ({LORA_KEY}); the LoRA checkpoint "
                        "is damaged")
    base = Path(os.path.normpath(step_dir / entry["base"]))
    if not base.is_dir():
        raise UserError(f"{step_dir} holds LoRA adapters of {base}, which no longer exists; restore that "
                        "checkpoint (keep_last may have pruned it) or retrain the adapters")
    check_same_base(step_dir, entry["base_fingerprint"], weights_fingerprint(base), base)
    return base


def check_same_base(step_dir, recorded: str, current: str, base) -> None:
    if recorded != current:
        raise UserError(f"{step_dir} holds LoRA adapters trained on other weights than {base} holds now "
                        "(its fingerprint changed: the base was retrained or replaced); restore the base "
                        "they were trained on, or train the adapters again (--force)")


def read_config(step_dir: Path) -> dict:
    try:
        return json.loads((Path(step_dir) / MODEL_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{Path(step_dir) / MODEL_CONFIG} unreadable ({e}); the checkpoint is damaged") from None



# -- the pinned base -----------------------------------------------------------------------

def pin_base(base_step: Path, run_dir: Path) -> Path:
    """`run_dir/base/`: the files of step folder `base_step` hard-linked (its DeepSpeed states
    left out) and the manifest of its run; a base that itself holds adapters gets its own base
    pinned inside. Returns the pin. An existing pin of the same weights is kept."""
    base_step, pin = Path(base_step), Path(run_dir) / PINNED_BASE
    if pin.is_dir() and pin.resolve() == base_step.resolve():
        return pin
    tmp = pin.with_name(f"{PINNED_BASE}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    _link_tree(base_step, tmp)
    if holds_adapters(base_step):  # its own base is named relative to it: pin that too
        config = read_config(base_step)
        pin_base(base_of(base_step, config), tmp)
        config[LORA_KEY]["base"] = PINNED_BASE
        (tmp / MODEL_CONFIG).unlink()
        write_atomic(tmp / MODEL_CONFIG, json.dumps(config, indent=2))
    run_manifest = base_step.parent / MANIFEST
    if run_manifest.is_file():
        shutil.copyfile(run_manifest, tmp / MANIFEST)
    shutil.rmtree(pin, ignore_errors=True)
    os.replace(tmp, pin)
    return pin


def _link_tree(src: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    for entry in src.iterdir():
        if entry.is_dir():
            if entry.name not in (DEEPSPEED, PINNED_BASE):
                _link_tree(entry, dest / entry.name)
        else:
            link_or_copy(entry, dest / entry.name)


def pinned_start(run_dir: Path, art, step_dir: Path):
    """(artifact, step folder) a LoRA run continuing in `run_dir` starts from: its pinned base,
    whatever the run --from names (`art`, `step_dir`) has done since; (art, step_dir) when the
    run has no checkpoint yet. Says so when the two differ."""
    run_dir = Path(run_dir)
    pin = run_dir / PINNED_BASE
    if not (pin / MANIFEST).is_file() or not any(is_complete(p) for p in step_dirs(run_dir)):
        return art, step_dir
    pinned = Artifact.open(pin)
    if weights_fingerprint(pin) != weights_fingerprint(step_dir):
        print(f"{run_dir.name}: continuing on its pinned base ({pin}); {step_dir} holds other weights "
              f"now. --force trains new adapters on those", flush=True)
    return pinned, pin
