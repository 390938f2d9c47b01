"""The keys of a config class, read from its source.

`llmkit <stage> --help` lists every key with its type, default and the comment beside it. The
classes live beside code that may import torch at the top, and `--help` must not: so the
dataclasses are read from their source files (ast for the fields, tokenize for the comments),
following base classes and nested sections through the modules' imports. A test checks that
this reading gives exactly the keys and defaults of the imported classes.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from llmkit.core.config import yaml_value


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
