"""The package's import graph has no cycle — counting imports inside functions too, since an
import deferred into a function hides a circle rather than removing it — and its lower floors
(the data wing, the model, LM scoring and the evaluation files) import nothing from the floors
above them (train/, eval/, the `llmkit` facade), inside functions neither."""

import ast
from pathlib import Path

import llmkit

PACKAGE = Path(llmkit.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The llmkit modules `path` imports anywhere in its body (a `from a.b import c` counts as
    `a.b.c` when that is a module, else `a.b`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                     else node.module for alias in node.names]
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    # a package's __init__ is imported with each of its modules; it is not an edge of its own
    return {name: imported_modules(path, modules) - {name} for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first = last), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


LOWER = ("llmkit.data", "llmkit.model", "llmkit.model_config", "llmkit.model_losses",
         "llmkit.lm_scoring", "llmkit.eval_files")  # with their sub-modules
ABOVE_THEM = ("llmkit.train", "llmkit.eval")
FACADE = "llmkit"  # the package's own __init__: `import llmkit; llmkit.load(…)` reaches train
def within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def is_above(target: str) -> bool:
    return target == FACADE or within(target, ABOVE_THEM)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`importer -> imported` for each import from a lower floor into the floors above it:
    train/, eval/ and the package facade."""
    return sorted(f"{module} -> {target}" for module, targets in graph.items() if within(module, LOWER)
                  for target in targets if is_above(target))


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_data_wing_and_the_model_import_nothing_from_train_eval_or_the_facade():
    assert upward_imports(import_graph()) == []


def test_the_upward_import_finder_finds_a_planted_one():
    graph = {"llmkit.data.tokenize": {"llmkit.checkpoints", "llmkit.train.loading"},
             "llmkit.model": {"llmkit.model_losses", "llmkit.train"}, "llmkit.model_losses": set(),
             "llmkit.modelling": {"llmkit.train.losses"}, "llmkit.train.losses": {"llmkit.model_losses"},
             "llmkit.lm_scoring": {"llmkit.evaluation", "llmkit.eval.data"}}
    assert upward_imports(graph) == ["llmkit.data.tokenize -> llmkit.train.loading",
                                     "llmkit.lm_scoring -> llmkit.eval.data",
                                     "llmkit.model -> llmkit.train"]


def test_the_finder_sees_upward_imports_inside_functions_and_through_the_facade(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from llmkit.data.io import read_jsonl\n\n\n"
        "def score(texts):\n"
        "    from llmkit.eval.scoring import LMScorer\n"
        "    return LMScorer\n\n\n"
        "class Scorer:\n"
        "    def open(self, path):\n"
        "        import llmkit\n"
        "        return llmkit.load(path)\n")
    modules = {"llmkit", "llmkit.data.io", "llmkit.eval.scoring", "llmkit.data.planted"}
    graph = {"llmkit.data.planted": imported_modules(planted, modules)}
    assert upward_imports(graph) == ["llmkit.data.planted -> llmkit",
                                     "llmkit.data.planted -> llmkit.eval.scoring"]
