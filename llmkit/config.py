"""Stage configuration: dataclass defaults < recipe section < `--set key=value` overrides.

Configs are plain (possibly nested) dataclasses defined beside the code that uses them. This
module turns YAML sections and `--set` strings into those dataclasses, checking every key and
type, so a typo fails loudly with the closest valid key instead of being ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
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
    return _build(cls, merged, _path)


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


def _suggest(key: str, cls, path: str) -> str:
    # matched against dotted keys and their last parts, so that `threshold` (a field given without
    # its section) finds `minhash.threshold`, and every section holding the best match is named
    keys = dotted_keys(cls)
    last = {k: k.rsplit(".", 1)[-1] for k in keys}
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


def config_to_dict(cfg) -> dict:
    """The resolved config as plain YAML-safe values (what goes in config.yaml and fingerprints)."""
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


def config_yaml(cfg, section: str, sources: dict[str, str]) -> str:
    """`cfg` as the recipe section `section:` that resolves to it, each value followed by
    `# <where it came from>` (`sources`: dotted key -> default | recipe | set)."""
    lines = [f"{section}:"]

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
        for path in _paths(layer or {}):
            for key in leaves:
                if path == key or path.startswith(key + ".") or key.startswith(path + "."):
                    out[key] = name
    return out


def _paths(layer: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in layer.items():
        if isinstance(v, dict) and v:
            out += _paths(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}")
    return out


def _is_section(cls, key: str) -> bool:
    *parents, leaf = key.split(".")
    for p in parents:
        cls = _dataclass_in(typing.get_type_hints(cls)[p])
    return _dataclass_in(typing.get_type_hints(cls)[leaf]) is not None


# -- the keys of a config class, read from its source --------------------------------------------
# `llmkit <stage> --help` lists every key with its type, default and the comment beside it. The
# classes live beside code that may import torch at the top, and `--help` must not: so the
# dataclasses are read from their source files (ast for the fields, tokenize for the comments),
# following base classes and nested sections through the modules' imports. A test checks that
# this reading gives exactly the keys and defaults of the imported classes.

@dataclasses.dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted: `model.n_layers`
    type: str  # the annotation as written in the source
    default: str  # as YAML (`null`, `[head, middle]`), or the source text when not a constant
    comment: str  # the `# comment` beside the field ("" when it has none)
    section: bool = False  # a nested config: its keys follow, as `key.<field>`


def documented_keys(target: str) -> list[KeyDoc]:
    """Every key of the config class `"package.module:Class"` (base classes' fields first, as
    dataclasses order them; nested sections followed by their keys), without importing it."""
    module, name = target.split(":")
    found = _source_class(_source_module(module), name)
    if found is None:
        raise ValueError(f"no class {name} in {module}")
    return _key_docs(*found, prefix="")


class _Module:
    def __init__(self, name: str):
        import ast
        import importlib.util
        import io
        import tokenize

        spec = importlib.util.find_spec(name)
        self.name = name
        self.package = name if spec.submodule_search_locations else name.rpartition(".")[0]
        self.source = Path(spec.origin).read_text(encoding="utf-8")
        self.lines = [line.encode() for line in self.source.splitlines(keepends=True)]
        self.tree = ast.parse(self.source)
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(self.source).readline)
                  if t.type == tokenize.COMMENT]
        self.comments = {t.start[0]: t.string for t in tokens}
        self.comment_lines = {t.start[0] for t in tokens if t.line.lstrip().startswith("#")}
        self.classes, self.imported, self.constants = {}, {}, {}
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, ast.ImportFrom):
                source = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                                     self.package) if node.level else node.module
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = (source, alias.name)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                self.constants[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                self.constants[node.target.id] = node.value


    def segment(self, node) -> str:
        """The source text of `node` (ast.get_source_segment, without splitting the file per call:
        ast's offsets are UTF-8 byte columns)."""
        lines = self.lines[node.lineno - 1:node.end_lineno]
        if len(lines) == 1:
            return lines[0][node.col_offset:node.end_col_offset].decode()
        return b"".join([lines[0][node.col_offset:], *lines[1:-1],
                         lines[-1][:node.end_col_offset]]).decode()


@functools.cache
def _source_module(name: str) -> _Module:
    return _Module(name)


def _source_class(mod: _Module, name: str, depth: int = 0):
    """(module, ClassDef) of `name` as seen from `mod`, following `from x import name`."""
    if name in mod.classes:
        return mod, mod.classes[name]
    if name in mod.imported and depth < 8:
        source, original = mod.imported[name]
        if source and source.startswith("llmkit"):
            return _source_class(_source_module(source), original, depth + 1)
    return None


def _is_dataclass_def(node) -> bool:
    import ast

    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if (isinstance(d, ast.Name) and d.id == "dataclass") or \
                (isinstance(d, ast.Attribute) and d.attr == "dataclass"):
            return True
    return False


def _field_nodes(mod: _Module, cls) -> dict:
    """name -> (module, AnnAssign) of a dataclass's fields, bases first; a field a subclass
    redeclares keeps its base's place (dataclasses' order)."""
    import ast

    fields: dict = {}
    for base in reversed(cls.bases):
        found = _source_class(mod, base.id) if isinstance(base, ast.Name) else None
        if found is not None and _is_dataclass_def(found[1]):
            fields.update(_field_nodes(*found))
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotation = mod.segment(node.annotation)
            if "ClassVar" not in annotation and "InitVar" not in annotation:
                fields[node.target.id] = (mod, node)
    return fields


def _key_docs(mod: _Module, cls, prefix: str) -> list[KeyDoc]:
    import ast

    docs = []
    for name, (fmod, node) in _field_nodes(mod, cls).items():
        value, factory = node.value, None
        if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) == "field":
            kwargs = {k.arg: k.value for k in value.keywords}
            if isinstance(kwargs.get("init"), ast.Constant) and kwargs["init"].value is False:
                continue
            value, factory = kwargs.get("default"), kwargs.get("default_factory")
        section = _section_class(fmod, node.annotation)
        comment = _comment_of(fmod, node)
        annotation = fmod.segment(node.annotation)
        if factory is not None:
            default = _shown(fmod, factory, call=True)
        elif value is not None:
            default = _shown(fmod, value)
        else:
            default = "(required)"
        docs.append(KeyDoc(prefix + name, annotation, default, comment, section is not None))
        if section is not None:
            docs += _key_docs(*section, prefix=f"{prefix}{name}.")
    return docs


def _comment_of(mod: _Module, node) -> str:
    """The comment after a field, with the comment-only lines that continue it (`#` then an
    indent, aligned under it); a comment line of one space (`# --- words`) heads what follows."""
    line = node.end_lineno if node.end_lineno in mod.comments else node.lineno
    if line not in mod.comments or line in mod.comment_lines:
        return ""
    parts = [mod.comments[line].lstrip("#").strip()]
    while line + 1 in mod.comment_lines and mod.comments[line + 1].startswith("#  "):
        line += 1
        parts.append(mod.comments[line].lstrip("#").strip())
    return " ".join(parts)


def _section_class(mod: _Module, annotation):
    """The dataclass an annotation names (`Section`, `Section | None`), or None."""
    import ast

    for node in ast.walk(annotation):
        if isinstance(node, ast.Name):
            found = _source_class(mod, node.id)
            if found is not None and _is_dataclass_def(found[1]):
                return found
    return None


class _NotConstant(Exception):
    pass


def _shown(mod: _Module, expr, call: bool = False) -> str:
    """A default as YAML when it is a constant; a factory (`call`) is called. A section's
    factory shows as the section (its keys follow)."""
    import ast

    if call and isinstance(expr, ast.Name) and _section_class(mod, expr) is not None:
        return f"{expr.id}()"
    if call and isinstance(expr, ast.Name) and expr.id not in _CALLABLE:
        return f"{expr.id}()"  # a factory function: what it builds is listed below
    try:
        value = _constant(mod, expr)
        if call:
            value = value() if callable(value) else value
        return yaml_value(value)
    except (_NotConstant, TypeError, ValueError):
        return mod.segment(expr)


_CALLABLE = {"list": list, "tuple": tuple, "dict": dict, "set": set, "frozenset": frozenset,
             "int": int, "float": float, "str": str, "sorted": sorted}


def _constant(mod: _Module, expr, depth: int = 0):
    """The value of a constant expression of the source: literals, module-level constants
    (imported ones too), arithmetic, list()/tuple()/dict() of those, and a lambda's body."""
    import ast
    import operator

    if depth > 20:
        raise _NotConstant
    again = functools.partial(_constant, mod, depth=depth + 1)
    if isinstance(expr, ast.Constant):
        return expr.value
    if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
        items = [again(e) for e in expr.elts]
        return tuple(items) if isinstance(expr, ast.Tuple) else items
    if isinstance(expr, ast.Dict):
        return {again(k): again(v) for k, v in zip(expr.keys, expr.values)}
    if isinstance(expr, ast.Lambda):
        body = expr.body
        return lambda: again(body)
    if isinstance(expr, ast.Name):
        if expr.id in _CALLABLE:
            return _CALLABLE[expr.id]
        if expr.id in mod.constants:
            return again(mod.constants[expr.id])
        if expr.id in mod.imported:
            source, original = mod.imported[expr.id]
            if source and source.startswith("llmkit"):
                return _constant(_source_module(source), ast.Name(original), depth + 1)
        raise _NotConstant
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in _CALLABLE \
            and not expr.keywords:
        return _CALLABLE[expr.func.id](*map(again, expr.args))
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow,
           ast.Mod: operator.mod, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
           ast.USub: operator.neg, ast.UAdd: operator.pos}
    if isinstance(expr, ast.BinOp) and type(expr.op) in ops:
        return ops[type(expr.op)](again(expr.left), again(expr.right))
    if isinstance(expr, ast.UnaryOp) and type(expr.op) in ops:
        return ops[type(expr.op)](again(expr.operand))
    raise _NotConstant
