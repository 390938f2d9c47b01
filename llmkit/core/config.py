"""Stage configuration: dataclass defaults < recipe section < `--set key=value` overrides.

Configs are plain (possibly nested) dataclasses defined beside the code that uses them. This
module turns YAML sections and `--set` strings into those dataclasses, checking every key and
type, so a typo fails loudly with the closest valid key instead of being ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any

from llmkit.errors import ConfigError


def load_recipe(path: str | Path | None) -> dict:
    """Read a recipe YAML (one mapping per stage); an absent path gives an empty recipe."""
    if path is None:
        return {}
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path} must be a mapping of stage name -> settings")
    return data


def parse_overrides(pairs: list[str] | None) -> dict:
    """`["model.n_layers=4", "lr=1e-3"]` -> `{"model": {"n_layers": "4"}, "lr": "1e-3"}`.

    Values stay strings here; `resolve_config` converts them to the field's type.
    """
    out: dict = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        node = out
        *parents, leaf = key.strip().split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {p} is both a value and a section")
        node[leaf] = _Raw(value)
    return out


class _Raw(str):
    """A value typed on the command line: parsed by the field's type, not taken literally."""


def resolve_config(cls, *layers: dict | None, _path: str = ""):
    """Build dataclass `cls` from its defaults updated by each layer in order (later wins)."""
    merged: dict = {}
    for layer in layers:
        if layer:
            if not isinstance(layer, dict):
                raise ConfigError(f"{_path or cls.__name__}: expected a mapping, got {layer!r}")
            _deep_update(merged, layer)
    try:
        return _build(cls, merged, _path)
    except ConfigError as e:
        raise ConfigError(f"{e}{_untyped_partners(str(e), cls, merged)}") from None


def _untyped_partners(message: str, cls, values: dict) -> str:
    """For a check across settings that --set broke (`warmup_steps (10) exceeds max_steps (6)`
    after --set max_steps=6): the other settings it names, which come from a recipe or the
    defaults, and how to change them too."""
    message = message.split("; valid keys")[0]  # an unknown key's message lists every setting
    names = [f.name for f in dataclasses.fields(cls) if f.init and re.search(rf"\b{f.name}\b", message)
             and not isinstance(values.get(f.name), dict)]  # a section is no setting to name
    typed = [n for n in names if isinstance(values.get(n), _Raw)]
    others = [n for n in names if n not in typed]
    if not typed or not others:
        return ""
    where = " and ".join(f"{n}={yaml_value(values[n])} (the recipe's)" if n in values else
                         f"{n} (its default)" for n in others)
    return f"; --set {typed[0]}={values[typed[0]]} meets {where}: set that too, e.g. " + \
        " ".join(f"--set {n}=…" for n in others)


def _deep_update(base: dict, new: dict) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v


def _build(cls, values: dict, path: str):
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        full = f"{path}{key}"
        if key not in fields:
            raise ConfigError(f"unknown key {full!r}{_suggest(key, cls, path)}")
        if isinstance(value, _Raw):
            _reject_glued_pairs(full, value, cls)
        kwargs[key] = _coerce(hints[key], value, full, fields[key])
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path.rstrip('.') or cls.__name__}: {e}") from None


def dotted_keys(cls, prefix: str = "") -> list[str]:
    """Every key a config dataclass accepts, sections and their fields: `method`, `minhash`,
    `minhash.threshold`, ..."""
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        keys.append(prefix + f.name)
        section = _dataclass_in(hints[f.name])
        if section is not None:
            keys += dotted_keys(section, f"{prefix}{f.name}.")
    return keys


def _dataclass_in(tp):
    """The dataclass `tp` is, or is optionally (`X | None`); else None."""
    candidates = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    return next((c for c in candidates if dataclasses.is_dataclass(c)), None)


# names other trainers give llmkit's settings (transformers' TrainingArguments, TRL, peft):
# no spelling distance leads from one to the other
ALIASES = {
    "learning_rate": "lr", "min_learning_rate": "min_lr", "max_grad_norm": "grad_clip",
    "per_device_train_batch_size": "micro_batch_size", "batch_size": "micro_batch_size",
    "gradient_accumulation_steps": "grad_accum", "gradient_checkpointing": "activation_checkpointing",
    "max_seq_length": "seq_len", "max_length": "seq_len", "block_size": "seq_len",
    "logging_steps": "log_every", "save_steps": "save_every", "eval_steps": "eval_every",
    "save_total_limit": "keep_last", "warmup": "warmup_steps", "num_threads": "threads",
    "lora_r": "lora.r", "lora_alpha": "lora.alpha", "lora_dropout": "lora.dropout",
    "target_modules": "lora.target", "lora_target": "lora.target",
}


def _suggest(key: str, cls, path: str) -> str:
    # matched against dotted keys and their last parts, so that `threshold` (a field given without
    # its section) finds `minhash.threshold`, and every section holding the best match is named
    keys = dotted_keys(cls)
    last = {k: k.rsplit(".", 1)[-1] for k in keys}
    if ALIASES.get(key) in keys:
        return f"; did you mean {path + ALIASES[key]!r} (what llmkit calls {key})?"
    best = difflib.get_close_matches(key, sorted(set(keys) | set(last.values())), n=1, cutoff=0.5)
    close = [k for k in keys if best and best[0] in (k, last[k])]
    if close:
        return f"; did you mean {' or '.join(repr(path + k) for k in close)}?"
    return f"; valid keys: {', '.join(sorted(k for k in keys if '.' not in k))}"


def _reject_glued_pairs(key: str, value: str, cls) -> None:
    """`--set "backend=kenlm kenlm_model=lm.bin"` would make one value of two settings."""
    head, *rest = re.split(r"\s+(?=[A-Za-z_][\w.]*=)", value)
    names = {k.rsplit(".", 1)[-1] for k in dotted_keys(cls)}
    if any(pair.partition("=")[0].rsplit(".", 1)[-1] in names for pair in rest):
        pairs = " ".join(f"--set {p}" for p in [f"{key}={head}", *rest])
        raise ConfigError(f"--set {key}={value!r} holds several settings; give one pair per --set: "
                          f"{pairs}")


def _coerce(tp, value, key: str, field):
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, _Raw) and value.lower() in ("none", "null", "")):
            if type(None) in args:
                return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, key, field)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key} is a section; set its fields, e.g. {key}.<field>=...")
        default = _field_default(field)
        base = config_to_dict(default) if default is not None else {}
        return resolve_config(tp, base, value, _path=f"{key}.")
    if origin is typing.Literal:
        v = str(value) if isinstance(value, _Raw) else value
        if v not in args:
            raise ConfigError(f"{key} must be one of {', '.join(map(repr, args))}, got {value!r}")
        return v
    if origin in (list, tuple):
        items = _split_list(value, key)
        inner = args[0] if args else Any
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(items) != len(args):
                raise ConfigError(f"{key} needs {len(args)} values, got {len(items)}")
            return tuple(_coerce(a, v, key, field) for a, v in zip(args, items))
        out = [_coerce(inner, v, key, field) for v in items]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if isinstance(value, _Raw):
            value = _yaml_value(value, key)
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        vt = args[1] if args else Any
        return {str(k): _coerce(vt, v, f"{key}.{k}", field) for k, v in value.items()}
    return _scalar(tp, value, key)


def _field_default(field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _split_list(value, key):
    if isinstance(value, _Raw):
        parsed = _yaml_value(value, key)
        if isinstance(parsed, list):
            return [_Raw(str(v)) if not isinstance(v, (dict, list)) else v for v in parsed]
        return [_Raw(v.strip()) for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ConfigError(f"{key} must be a list, got {value!r}")


def _yaml_value(value: str, key: str):
    import yaml

    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        raise ConfigError(f"{key}: cannot parse {value!r}") from None


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _scalar(tp, value, key):
    raw = isinstance(value, _Raw)
    try:
        if tp is Any:
            return _yaml_value(value, key) if raw else value
        if tp is bool:
            if isinstance(value, bool):
                return value
            if raw and value.lower() in _TRUE | _FALSE:
                return value.lower() in _TRUE
        elif tp is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if raw:
                f = float(value)
                if f.is_integer():
                    return int(f)
        elif tp is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            if raw:
                return float(value)
        elif tp is str:
            if isinstance(value, str):
                return str(value)
        elif tp is Path:
            if isinstance(value, (str, Path)):
                return Path(value)
        else:
            return value
    except ValueError:
        pass
    name = getattr(tp, "__name__", str(tp))
    raise ConfigError(f"{key} must be {name}, got {value!r}")


def config_to_dict(cfg, fingerprint: bool = False) -> dict:
    """The resolved config as plain YAML-safe values (what goes in config.yaml); with
    `fingerprint`, without the fields that only say where a stage runs (metadata
    {"fingerprint": False}, llmkit.core.executor.RUN_OPTION): what an artifact's fingerprint hashes."""
    if fingerprint and dataclasses.is_dataclass(cfg):
        return {f.name: _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
                if f.metadata.get("fingerprint", True)}
    return _plain(cfg)


def _plain(v):
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, Path):
        return str(v)
    return v


def yaml_value(value) -> str:
    """One value as YAML on one line (`null`, `3.0e-05`, `[head, middle]`, `{web: 0.5}`), as a
    recipe or `--set` takes it."""
    import yaml

    text = yaml.safe_dump(_plain(value), default_flow_style=True, allow_unicode=True,
                          width=float("inf"), sort_keys=False).strip()
    return text.removesuffix("\n...").strip()


def config_yaml(cfg, section: str, sources: dict[str, str], stage: str | None = None) -> str:
    """`cfg` as the recipe section `section:` that resolves to it, each value followed by
    `# <where it came from>` (`sources`: dotted key -> default | recipe | set); with the
    `stage:` line of a section for one artifact of `stage`."""
    lines = [f"{section}:"] + ([f"  stage: {stage}"] if stage else [])

    def emit(obj, prefix: str, indent: str) -> None:
        for f in dataclasses.fields(obj):
            if not f.init:
                continue
            value, key = getattr(obj, f.name), prefix + f.name
            if dataclasses.is_dataclass(value):
                lines.append(f"{indent}{f.name}:")
                emit(value, f"{key}.", indent + "  ")
            else:
                lines.append(f"{indent}{f.name}: {yaml_value(value)}  # {sources.get(key, 'default')}")

    emit(cfg, "", "  ")
    return "\n".join(lines) + "\n"


def value_sources(cls, layers: dict[str, dict | None]) -> dict[str, str]:
    """Dotted key of every value of `cls` -> the name of the last layer that set it (layers in
    increasing precedence, e.g. {"recipe": section, "set": overrides}); unset keys are absent.
    A layer that sets part of a mapping value (`mixture_weights.web`) sets the whole value."""
    leaves = [k for k in dotted_keys(cls) if not _is_section(cls, k)]
    out = {}
    for name, layer in layers.items():
        for path, _ in dotted_items(layer or {}):
            for key in leaves:
                if path == key or path.startswith(key + ".") or key.startswith(path + "."):
                    out[key] = name
    return out


def dotted_items(layer: dict, prefix: str = "") -> list[tuple[str, object]]:
    """`{model: {n_layers: 2}, lr: 1e-3}` -> [("model.n_layers", 2), ("lr", 1e-3)]: nested sections
    as the dotted keys `--set` spells."""
    out = []
    for k, v in layer.items():
        if isinstance(v, dict) and v:
            out += dotted_items(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _is_section(cls, key: str) -> bool:
    *parents, leaf = key.split(".")
    for p in parents:
        cls = _dataclass_in(typing.get_type_hints(cls)[p])
    return _dataclass_in(typing.get_type_hints(cls)[leaf]) is not None
