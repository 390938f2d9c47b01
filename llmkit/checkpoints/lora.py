"""LoRA (Hu et al. 2021) through `peft`: low-rank adapters trained in place of a model's weights.

`--set lora.r=16` on any trainer (sft, rm, dpo, ppo, pretrain --from) freezes the starting
weights and trains adapters on the linear layers of the decoder blocks (`lora.target`); a new
head that the stage adds (rm's `score`) trains in full beside them. peft injects the adapters
into llmkit's own `Transformer` by module name: its names are Hugging Face Llama's, so the
adapters are peft's own format and load onto `AutoModelForCausalLM` as they are.

A LoRA run's step folders hold the adapters (`adapter_model.safetensors`, `adapter_config.json`:
what `peft.PeftModel.save_pretrained` writes) and, in `config.json` under `llmkit_lora`, the
base step folder they adapt (relative to the step folder) and the fingerprint of its weights:
loading refuses a base that changed since. `llmkit.load` merges the adapters into the base in
memory, so generate / eval / export see a plain model.

The run pins its base: `RUN/base/` holds the base step folder's files as hard links (a copy
where the filesystem has none) and the manifest of the run they came from, and the step
folders name that. Pruning, extending or --force-retraining the base run then cannot take the
adapters' base away, and a continued LoRA run starts from its pin, not from where --from's run
has moved since.

QLoRA: `lora.quant=nf4|fp4|int8` holds the frozen base in 4 or 8 bits (`model.quant`) while the
adapters train in the run's precision; `lora.use_dora` (Liu et al. 2024: a trained magnitude per
output row beside the low-rank direction) and `lora.use_rslora` (Kalajdzievski 2023: scale
alpha/sqrt(r), which keeps large ranks learning) are peft's own. The step folders record the
quantisation beside the base (`llmkit_lora.quant`), and loading merges the adapters into the
base's dequantised weights: the function the adapters were trained with, as float layers.

The step folders' files and the pinned base: `llmkit.checkpoints.lora_files`. `import peft` (~3-6 s: it
imports transformers) happens only in the functions that need it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from llmkit.checkpoints.step_folders import ADAPTER_WEIGHTS
from llmkit.errors import ConfigError, UserError
from llmkit.checkpoints import new_rows
from llmkit.model import quant as quantization
from llmkit.checkpoints.lora_files import (ADAPTER_NAME, LORA_KEY, PEFT_PREFIX, PINNED_BASE, base_of, check_same_base,
                                     config_entry, holds_adapters, llmkit_names, pin_base, pinned_start,
                                     read_config, save_adapters, weights_fingerprint)

# the names callers import from here, the step folders' side defined in llmkit.checkpoints.lora_files
__all__ = ["LoraConfig", "Adapters", "ALL_LINEAR", "ATTENTION", "PRESETS", "import_peft", "target_modules",
           "add_adapters", "adapters_of", "adapters_disabled", "merge_adapters", "trainable_share",
           "load_adapters", "ADAPTER_NAME", "LORA_KEY", "PEFT_PREFIX", "PINNED_BASE", "base_of",
           "check_same_base", "config_entry", "holds_adapters", "pin_base", "pinned_start", "read_config",
           "save_adapters", "weights_fingerprint"]

ALL_LINEAR = "all-linear"
ATTENTION = "attention"  # the token mixers' projections only (the original LoRA paper's choice)
# softmax attention's, and the Gated DeltaNet mixers' of hybrid models (Qwen3.5: transformers' and peft's
# names): their linear-attention layers are attention layers too, and an `attention` preset that skipped
# them would leave three layers in four without adapters
ATTENTION_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                    "out_proj")
PRESETS = (ALL_LINEAR, ATTENTION)


@dataclass
class LoraConfig:
    """The `lora` section of every trainer's config; off while r is 0."""

    r: int = 0  # adapter rank; 0 = no LoRA (every weight trains)
    alpha: float = 16.0  # scale of the adapters' update: alpha / r (LoRA's α)
    dropout: float = 0.0  # dropout on the adapters' input
    target: str | list[str] = ALL_LINEAR  # all-linear (every linear layer of the blocks), attention (q/k/v/o, and a hybrid's Gated DeltaNet projections) or module names: q_proj,v_proj,...
    quant: str = "none"  # the frozen base's storage: none | nf4 | fp4 (4 bits, QLoRA) | int8 (bitsandbytes)
    double_quant: bool = True  # nf4/fp4: quantise the absmax of each block too (~0.37 bit per weight saved)
    use_dora: bool = False  # DoRA: train a magnitude per output row beside the low-rank direction
    use_rslora: bool = False  # rsLoRA: scale the update by alpha/sqrt(r) instead of alpha/r
    base_products: str = "fp32"  # fp32 | bf16: a CPU run's frozen fp32 base multiplies through bf16 copies
    #                              (forward and input gradient; adapters, optimizer and the rest stay fp32)

    def __post_init__(self):
        if self.r < 0:
            raise ConfigError(f"lora.r must be >= 0 (0 = off), got {self.r}")
        if not self.alpha > 0:
            raise ConfigError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        # a string is a comma list (`q_proj,v_proj`), brackets allowed (`[q_proj, v_proj]`)
        names = (re.findall(r"[^\s,\[\]'\"]+", self.target) if isinstance(self.target, str)
                 else [str(n).strip() for n in self.target if str(n).strip()])
        if not names:
            raise ConfigError(f"lora.target must be {' or '.join(PRESETS)} or module names like q_proj,v_proj")
        self.target = names[0] if len(names) == 1 and names[0] in PRESETS else names
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z_]\w*", n)] if self.target not in PRESETS else []
        if bad:
            raise ConfigError(f"lora.target: {', '.join(map(repr, bad))} is not a module name; give "
                              f"{' or '.join(PRESETS)} or names like q_proj,v_proj")
        if self.quant not in quantization.QUANTS:
            raise ConfigError(f"lora.quant must be one of {', '.join(quantization.QUANTS)}, got {self.quant!r}")
        if self.base_products not in ("fp32", "bf16"):
            raise ConfigError(f"lora.base_products must be fp32 or bf16, got {self.base_products!r}")
        if self.base_products == "bf16" and self.quant != "none":
            raise ConfigError(f"lora.base_products=bf16 multiplies an fp32 base through bf16 copies; a "
                              f"quantised base (lora.quant={self.quant}) computes in the run's precision")
        if self.quant == "int8" and self.use_dora:
            raise ConfigError("lora.use_dora with lora.quant=int8: peft's DoRA on bitsandbytes' 8-bit layers "
                              "loses their scales and fails; use lora.quant=nf4 (or fp4) with DoRA")

    @property
    def enabled(self) -> bool:
        return self.r > 0

    @property
    def quantized(self) -> bool:
        return self.enabled and self.quant != "none"


@dataclass
class Adapters:
    """What a model with adapters carries beside them (as `model.llmkit_lora`): enough to write
    a checkpoint that names its base."""

    peft_config: object  # peft.LoraConfig the adapters were made with
    base: Path  # the step folder of the frozen weights
    base_fingerprint: str  # `weights_fingerprint(base)` when the adapters were added
    trained_in_full: tuple[str, ...] = ()  # modules saved whole beside the adapters (rm's score)
    quant: str = "none"  # how the frozen base was held while training (`LoraConfig.quant`)
    double_quant: bool = True


# -- adding, disabling and merging adapters -------------------------------------------------

def import_peft():
    """peft, or a UserError saying how to install it (it is an optional dependency)."""
    try:
        import peft
    except ImportError:
        raise UserError("lora.r > 0 needs the peft package: pip install 'llmkit[lora]' (or peft>=0.21)") from None
    return peft


def linear_layer_names(model) -> list[str]:
    """The names (last part) of the linear layers in the model's decoder blocks: what
    lora.target may name."""
    import torch.nn as nn

    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, nn.Linear) and ".layers." in f".{name}"})


def target_modules(model, cfg: LoraConfig) -> list[str]:
    """cfg.target as module names of `model`; a ConfigError names the ones that exist."""
    known = linear_layer_names(model)
    if cfg.target == ALL_LINEAR:
        return known
    if cfg.target == ATTENTION:
        return [n for n in known if n in ATTENTION_LAYERS]
    unknown = [n for n in cfg.target if n not in known]
    if unknown:
        raise ConfigError(f"lora.target: the model has no linear layer {', '.join(map(repr, unknown))}; "
                          f"its blocks' linear layers are {', '.join(known)} (or use {ALL_LINEAR})")
    return list(cfg.target)


def add_adapters(model, cfg: LoraConfig, base, seed: int = 0, compute_dtype=None):
    """Freeze `model` (its block linears quantised when cfg.quant asks, computing in
    `compute_dtype`: the run's precision) and inject LoRA adapters (peft's LoRA layers, lora_B
    zero: the model's output is unchanged until it trains); the modules it lists in
    `heads_trained_in_full` stay trainable. `base` is the step folder its weights came from.
    Returns the model (changed in place). The adapters' initial values depend on `seed` only, so
    every process of a run builds the same ones."""
    import torch

    peft = import_peft()
    full = tuple(getattr(model, "heads_trained_in_full", ()))
    peft_config = peft_lora_config(peft, cfg, target_modules(model, cfg), full,
                                   getattr(model, "peft_task_type", "CAUSAL_LM"))
    # an extended model's new rows train too (llmkit.checkpoints.new_rows)
    rows = new_rows.trainable_token_indices(model, new_rows.new_token_ids(base))
    peft_config = dataclasses.replace(peft_config, trainable_token_indices=rows)
    model.requires_grad_(False)
    quantization.quantize_linears(model, cfg.quant, cfg.double_quant, compute_dtype)
    # trained whole by hand: their names stay; new rows wrapped by hand: llmkit's model is not transformers'
    injected = dataclasses.replace(peft_config, modules_to_save=None, trainable_token_indices=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft.inject_adapter_in_model(injected, model, adapter_name=ADAPTER_NAME)
    for name in full:
        model.get_submodule(name).requires_grad_(True)
    new_rows.add_new_rows(model, rows)
    model.llmkit_lora = Adapters(peft_config, Path(base).resolve(), weights_fingerprint(base), full,
                                 cfg.quant, cfg.double_quant)
    return model


def peft_lora_config(peft, cfg: LoraConfig, targets: list[str], full: tuple, task_type: str):
    """The peft.LoraConfig of `cfg` (what adapter_config.json records)."""
    return peft.LoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none", target_modules=targets,
        modules_to_save=list(full) or None, task_type=task_type, use_dora=cfg.use_dora,
        use_rslora=cfg.use_rslora)


def adapters_of(module) -> Adapters | None:
    """The `Adapters` of a module that has them (see `add_adapters`), else None."""
    return getattr(module, "llmkit_lora", None)


@contextlib.contextmanager
def adapters_disabled(module):
    """Within: `module` computes as its frozen base (peft's `disable_adapter`), so the same
    weights serve as the reference of DPO and PPO."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in module.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield module
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def merge_adapters(model):
    """Fold each adapter into its base weight (W + B·A·alpha/r; DoRA rescales each row) and put
    the plain layer back: a model without adapters, in place. A quantised base is merged
    dequantised: float32 layers holding what the 4/8-bit ones computed with."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    new_rows.merge_new_rows(model)
    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            base = module.get_base_layer()
            if quantization.is_quantized(base):
                base = merged_dequantized(module)
            else:
                module.merge()
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, base)
    quantization.dequantize_linears(model)  # the quantised layers no adapter targeted
    for attr in ("llmkit_lora", "peft_config"):
        model.__dict__.pop(attr, None)
    return model


def merged_dequantized(layer):
    """A float32 nn.Linear: the dequantised base weight of a peft bitsandbytes LoRA layer with its
    adapter folded in, as peft's own bitsandbytes merge computes it before re-quantising."""
    import torch
    import torch.nn as nn

    base = layer.get_base_layer()
    with torch.no_grad():
        weight = quantization.dequantized_weight(base)
        delta = layer.get_delta_weight(ADAPTER_NAME).float()
        if layer.use_dora.get(ADAPTER_NAME):
            magnitude = layer.lora_magnitude_vector[ADAPTER_NAME]
            norm = magnitude.get_weight_norm(weight, delta, scaling=1)
            weight = (magnitude.weight.float() / norm).view(-1, 1) * (weight + delta)
        else:
            weight = weight + delta
    linear = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if base.bias is not None:
        linear.bias = nn.Parameter(base.bias.detach().float().clone(), requires_grad=False)
    return linear


def trainable_share(model) -> dict:
    """Trainable parameters and their share of all parameters (for a run's stats)."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"trainable_parameters": trainable, "trainable_share": round(trainable / total, 6)}


# -- loading a step folder's adapters onto its base -------------------------------------------

def load_adapters(model, step_dir, merge: bool = True):
    """`model` (the base of LoRA step folder `step_dir`, see `base_of`) with the folder's adapters
    (and heads trained in full) — merged into its weights unless merge=False. In place. Adapters
    trained on a quantised base (`llmkit_lora.quant`) go on its dequantised weights."""
    from safetensors.torch import load_file

    peft = import_peft()
    step_dir = Path(step_dir)
    entry = read_config(step_dir).get(LORA_KEY) or {}
    quantization.round_trip(model, entry.get("quant", "none"), entry.get("double_quant", True))
    peft_config = peft.LoraConfig.from_pretrained(str(step_dir))
    full = tuple(peft_config.modules_to_save or ())
    peft.inject_adapter_in_model(dataclasses.replace(peft_config, modules_to_save=None, inference_mode=True,
                                                     trainable_token_indices=None), model, adapter_name=ADAPTER_NAME)
    new_rows.add_new_rows(model, peft_config.trainable_token_indices, inference_mode=True)
    tensors = llmkit_names(load_file(str(step_dir / ADAPTER_WEIGHTS)))
    expected = {n for n, _ in model.named_parameters()
                if ".lora_" in n or n.split(".")[0] in full or new_rows.is_new_rows_tensor(n)}
    missing, unexpected = expected - set(tensors), set(tensors) - expected
    if missing or unexpected:
        raise UserError(f"{step_dir / ADAPTER_WEIGHTS} does not fit its base model (missing "
                        f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}); the checkpoint is damaged")
    model.load_state_dict(tensors, strict=False)
    return merge_adapters(model) if merge else model
