"""llmkit's own imports sit at the top of a module. One stays inside a function only for a
reason this test can name: the module it loads brings a heavy package at its top (directly or
through its own top-level imports), or it breaks a load-order need written in LOAD_ORDER below.
An import inside a function hides a module's dependencies from its header, so each needs one."""

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import llmkit
from llmkit.stages import deferred

PACKAGE = Path(llmkit.__file__).parent
MAX_FUNCTION_IMPORTS = 44  # 40 until the decode kernels, the gate and replay deferred torch-loading modules, 42 until
# the meta-device load (checkpoints/loading.py builds the torch model without initialising it)
# packages that cost seconds or gigabytes to import: a module loading one is worth deferring
HEAVY = {"torch", "deepspeed", "numba", "transformers", "peft", "ray", "bitsandbytes", "lm_eval", "trl"}
# light enough for a library, not for `llmkit --help`, which loads the CLI modules and their imports
HEAVY_FOR_HELP = {"pyarrow", "numpy", "sentencepiece"}
# (importing file, imported module) -> why the import cannot sit at the top of that file
LOAD_ORDER: dict[tuple[str, str], str] = {
    ("__init__.py", "llmkit.api"):
        "the package's __init__ runs before every llmkit module: the API at its top would load "
        "checkpoint loading, generation and the tokenizer with each of them, `llmkit --help` included",
}


@dataclass(frozen=True)
class FunctionImport:
    file: str  # relative to the package: "eval/stage.py"
    line: int
    target: str  # the llmkit module it loads: "llmkit.checkpoints.loading"


def module_name(rel: Path) -> str:
    parts = ("llmkit",) + rel.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolved(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module of a `from … import` (relative ones resolved against `importer`)."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported(node: ast.stmt, importer: str, is_package: bool, modules: set[str]) -> list[str]:
    """The modules an import statement loads: `from a.b import c` loads `a.b.c` when that is a
    module, else `a.b`; any other package's names stay as written (`torch.nn`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    module = resolved(node, importer, is_package)
    return [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]


def is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def split_imports(tree: ast.Module) -> tuple[list[ast.stmt], list[ast.stmt]]:
    """(imports run when the module loads, imports inside a function body). A class body runs
    at load; an `if TYPE_CHECKING:` block never runs."""
    top, inside = [], []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if is_type_checking_block(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inside if in_function else top).append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return top, inside


def with_parents(module: str) -> list[str]:
    """Importing `a.b.c` runs `a`, `a.b` and `a.b.c`."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def is_own(module: str) -> bool:
    return module == "llmkit" or module.startswith("llmkit.")


class Package:
    """llmkit's modules as source: what each imports at its top and inside its functions."""

    def __init__(self, sources: dict[str, str]):  # relative path -> source
        self.paths = {module_name(Path(rel)): rel for rel in sources}
        modules = set(self.paths)
        self.top: dict[str, set[str]] = {}
        self.inside: list[FunctionImport] = []
        self.top_of_file: dict[str, set[str]] = {}
        self._loads: dict[str, set[str]] = {}
        for rel, source in sources.items():
            name, is_package = module_name(Path(rel)), rel.endswith("__init__.py")
            top, inside = split_imports(ast.parse(source))
            self.top[name] = {m for node in top for m in imported(node, name, is_package, modules)}
            self.top_of_file[rel] = {m for m in self.top[name] if is_own(m)}
            self.inside += [FunctionImport(rel, node.lineno, m) for node in inside
                            for m in imported(node, name, is_package, modules) if is_own(m)]

    def loads(self, module: str) -> set[str]:
        """Every module (llmkit's and others') that importing `module` runs, transitively."""
        if module in self._loads:
            return self._loads[module]
        seen, todo = set(), [module]
        while todo:
            for m in with_parents(todo.pop()):
                if m not in seen:
                    seen.add(m)
                    todo += self.top.get(m, ())
        self._loads[module] = seen
        return seen

    def heavy_packages(self, module: str, heavy: set[str]) -> set[str]:
        return {m.split(".")[0] for m in self.loads(module)} & heavy

    @functools.cached_property
    def help_loads(self) -> set[str]:
        """What `llmkit --help` imports: the app and each command's module."""
        return set().union(*(self.loads(m) for m in self.paths if m.startswith("llmkit.cli.")))

    def reason(self, found: FunctionImport) -> str | None:
        """Why `found` sits inside a function, or None when it should move to the top."""
        if found.target in self.top_of_file[found.file]:
            return None  # the file already loads it at its top
        if heavy := self.heavy_packages(found.target, HEAVY):
            return "defers " + ", ".join(sorted(heavy))
        importer = module_name(Path(found.file))
        if importer in self.help_loads and (heavy := self.heavy_packages(found.target, HEAVY_FOR_HELP)):
            return "keeps `llmkit --help` free of " + ", ".join(sorted(heavy))
        return LOAD_ORDER.get((found.file, found.target))

    def unexplained(self) -> list[str]:
        return list(dict.fromkeys(
            f"{f.file}:{f.line} imports {f.target}" + (" again" if f.target in self.top_of_file[f.file] else "")
            for f in self.inside if self.reason(f) is None))


def package_sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}


def test_each_import_inside_a_function_has_a_reason():
    assert Package(package_sources()).unexplained() == []


def test_few_imports_sit_inside_functions():
    statements = sorted({f"{f.file}:{f.line}" for f in Package(package_sources()).inside})
    assert len(statements) <= MAX_FUNCTION_IMPORTS, statements


def test_each_load_order_exception_is_still_inside_a_function():
    inside = {(f.file, f.target) for f in Package(package_sources()).inside}
    assert set(LOAD_ORDER) <= inside, set(LOAD_ORDER) - inside


PLANTED = {
    "__init__.py": "",
    "light.py": "import json\n",
    "heavy.py": "import torch\n",
    "through.py": "from llmkit import heavy\n",  # heavy at one remove
    "arrow.py": "import pyarrow\n",
    "cli/__init__.py": "",
    "cli/cmd.py": "def run():\n    from llmkit.arrow import x\n",  # keeps --help light
    "user.py": ("from llmkit.light import a\n"
                "class C:\n    from llmkit import heavy\n"  # a class body runs at load
                "def f():\n    from llmkit.light import b\n"  # repeats the top
                "def g():\n    import llmkit.through\n"  # defers torch through `through`
                "def h():\n    from . import arrow\n"  # pyarrow is light outside the CLI
                "def k():\n    from llmkit.heavy import t\n"),  # already loaded by the class body
}


def test_the_finder_names_a_planted_needless_import():
    package = Package(PLANTED)
    assert {(f.file, f.line, f.target) for f in package.inside} == {
        ("cli/cmd.py", 2, "llmkit.arrow"), ("user.py", 5, "llmkit.light"), ("user.py", 7, "llmkit.through"),
        ("user.py", 9, "llmkit.arrow"), ("user.py", 11, "llmkit.heavy")}
    assert package.unexplained() == ["user.py:5 imports llmkit.light again", "user.py:9 imports llmkit.arrow",
                                     "user.py:11 imports llmkit.heavy again"]
    assert package.reason(FunctionImport("user.py", 7, "llmkit.through")) == "defers torch"
    assert package.reason(FunctionImport("cli/cmd.py", 2, "llmkit.arrow")) == "keeps `llmkit --help` free of pyarrow"


def deferred_targets(sources: dict[str, str]) -> list[str]:
    """The `"module:function"` names the package hands `llmkit.stages.deferred`."""
    return [call.args[0].value for source in sources.values() for call in ast.walk(ast.parse(source))
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "deferred"
            and call.args and isinstance(call.args[0], ast.Constant)]


def test_each_deferred_function_exists_where_it_is_named():
    sources = package_sources()
    targets = deferred_targets(sources)
    assert len(targets) >= 20  # each command's library function
    missing = []
    for target in targets:
        module, name = target.split(":")
        rel = next((r for r in sources if module_name(Path(r)) == module), None)
        defined = rel and {n.name for n in ast.parse(sources[rel]).body
                           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if not defined or name not in defined:
            missing.append(target)
    assert missing == []


def test_a_deferred_function_imports_its_module_on_the_first_call(tmp_path, monkeypatch):
    (tmp_path / "planted_stage.py").write_text("def run(x, *, by):\n    return x * by\n")
    monkeypatch.syspath_prepend(tmp_path)
    run = deferred("planted_stage:run")
    assert "planted_stage" not in sys.modules and run.__name__ == "run"
    assert run(3, by=2) == 6 and "planted_stage" in sys.modules
    monkeypatch.delitem(sys.modules, "planted_stage")
