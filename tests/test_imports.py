"""The package's import graph has no cycle — counting imports inside functions too, since an
import deferred into a function hides a circle rather than removing it — and it stands on floors:
each module imports nothing from a floor above its own, inside functions neither, and not through
other modules either (the closure of its imports: `data -> checkpoints.loading -> train` is the
data wing reaching train)."""

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


# Bottom first. A floor is modules and packages (with their sub-modules); a module may import
# from its own floor and those below, never from one above. A new root module names its floor here.
FLOORS = (
    ("llmkit.errors", "llmkit.version", "llmkit.stages", "llmkit.dryrun"),  # leaves: nothing of llmkit
    ("llmkit.core",),  # the stage framework: context, config, workspace, executor
    ("llmkit.tokenizers",),
    ("llmkit.model",),
    ("llmkit.rewards",),  # reward functions of sampled responses: built-ins, user files, their weighting
    ("llmkit.checkpoints",),  # step folders, LoRA files, loading a model
    ("llmkit.data",),
    ("llmkit.train", "llmkit.eval", "llmkit.hf", "llmkit.judge", "llmkit.generation",
     "llmkit.merge", "llmkit.synth"),  # the wings
    ("llmkit.api", "llmkit.status", "llmkit.report", "llmkit.ablate"),  # commands across the wings
    ("llmkit", "llmkit.cli", "llmkit.__main__"),  # the facade and the CLI
)


def floor_of(module: str, floors=FLOORS) -> int | None:
    """The index of `module`'s floor: its longest-named entry (`llmkit.model.decoding` is on
    `llmkit.model`'s floor, the facade `llmkit` only itself), or None."""
    best = None
    for index, names in enumerate(floors):
        for name in names:
            if (module == name or (name != "llmkit" and module.startswith(name + "."))) and (
                    best is None or len(name) > len(best[1])):
                best = (index, name)
    return None if best is None else best[0]


def upward_paths(graph: dict[str, set[str]], floors=FLOORS) -> list[str]:
    """`importer -> ... -> target` for each module that reaches, directly or through other
    modules, a module on a floor above its own: the shortest such path per (importer, target)."""
    found = []
    for start in sorted(graph):
        own = floor_of(start, floors)
        if own is None:
            continue
        came_from = {start: None}
        queue = [start]
        while queue:  # breadth first: the first path to a module is a shortest one
            node = queue.pop(0)
            for nxt in sorted(graph.get(node, ())):
                if nxt in came_from:
                    continue
                came_from[nxt] = node
                queue.append(nxt)
                if (floor_of(nxt, floors) or 0) > own:
                    path, step = [], nxt
                    while step is not None:
                        path.append(step)
                        step = came_from[step]
                    found.append(" -> ".join(reversed(path)))
    return found


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_has_a_floor():
    assert sorted(m for m in import_graph() if floor_of(m) is None) == []


def test_no_module_reaches_a_floor_above_its_own():
    assert upward_paths(import_graph()) == []


def test_the_floors_catch_a_planted_upward_path_one_hop_removed():
    """The data wing calling loading, which imports train: no direct edge goes up from data, yet
    data reaches train through checkpoints."""
    graph = {"llmkit.data.ppl_filter": {"llmkit.checkpoints.loading", "llmkit.data.io"},
             "llmkit.data.io": {"llmkit.errors"}, "llmkit.errors": set(),
             "llmkit.checkpoints.loading": {"llmkit.model.transformer", "llmkit.train.lora"},
             "llmkit.model.transformer": set(), "llmkit.train.lora": set()}
    assert upward_paths(graph) == [
        "llmkit.checkpoints.loading -> llmkit.train.lora",
        "llmkit.data.ppl_filter -> llmkit.checkpoints.loading -> llmkit.train.lora"]
    del graph["llmkit.checkpoints.loading"]  # the seam: loading no longer imports train
    assert upward_paths(graph) == []


def test_the_floors_are_found_by_the_longest_name():
    floors = (("llmkit.errors",), ("llmkit.model",), ("llmkit.train",), ("llmkit",))
    assert [floor_of(m, floors) for m in ("llmkit.errors", "llmkit.model.decoding", "llmkit.train.lora",
                                          "llmkit", "llmkit.models", "llmkit.stray")] == [0, 1, 2, 3, None, None]
    graph = {"llmkit.model.decoding": {"llmkit.errors"}, "llmkit.errors": {"llmkit"}, "llmkit": set(),
             "llmkit.train.lora": {"llmkit.model.decoding"}}
    assert upward_paths(graph, floors) == ["llmkit.errors -> llmkit",
                                           "llmkit.model.decoding -> llmkit.errors -> llmkit",
                                           "llmkit.train.lora -> llmkit.model.decoding -> llmkit.errors -> llmkit"]


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
    assert upward_paths(graph) == ["llmkit.data.planted -> llmkit",
                                   "llmkit.data.planted -> llmkit.eval.scoring"]
