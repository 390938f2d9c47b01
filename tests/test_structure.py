"""The package keeps the shape its structure issue gave it: small cohesive modules, and training
stages that only name their parts (train.stage.fit_stage owns the skeleton)."""

import ast
from pathlib import Path

import pytest

import llmkit
from llmkit.stages import TRAINING

PACKAGE = Path(llmkit.__file__).parent
MAX_MODULE_LINES = 450  # room for the next feature under the 500 the style guide allows
MAX_STAGE_FUNCTION_LINES = 20


def test_no_module_is_over_450_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, long


@pytest.mark.parametrize("stage", TRAINING)
def test_each_training_stage_function_only_names_its_parts(stage):
    tree = ast.parse((PACKAGE / "train" / f"{stage}.py").read_text(encoding="utf-8"))
    run = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == f"run_{stage}")
    assert run.end_lineno - run.lineno + 1 <= MAX_STAGE_FUNCTION_LINES
    assert any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == "fit_stage" for c in ast.walk(run))


# every data stage made of sealed tasks -> (its module, its entry function)
DATA_STAGES = {"ingest": ("data/ingest.py", "run_ingest"),
               "clean": ("data/clean_stage.py", "run_clean"),
               "dedup": ("data/dedup/stage.py", "run_dedup"),
               "ppl-filter": ("data/ppl_filter.py", "run_ppl_filter"),
               "decontaminate": ("data/decontam.py", "run_decontaminate"),
               "quality": ("data/quality.py", "run_quality"),
               "tokenize": ("data/tokenize.py", "run_tokenize"),
               "synth": ("synth/stage.py", "run_synth")}


def test_every_data_stage_with_a_run_section_is_listed():
    from llmkit.data.driver import DataConfig
    from llmkit.stages import STAGES, config_class

    data = {s.command for s in STAGES if s.config and issubclass(config_class(s.command), DataConfig)}
    assert data == set(DATA_STAGES)


@pytest.mark.parametrize("stage", DATA_STAGES)
def test_each_data_stage_function_only_names_its_parts(stage):
    """The data wing's shape: an entry function names inputs, phases and assembly;
    llmkit.data.driver.run_data_stage owns the rest."""
    module, name = DATA_STAGES[stage]
    tree = ast.parse((PACKAGE / module).read_text(encoding="utf-8"))
    run = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    assert run.end_lineno - run.lineno + 1 <= MAX_STAGE_FUNCTION_LINES
    assert any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == "run_data_stage"
               for c in ast.walk(run))


MARKER_WRITER = "data/driver.py"  # run_task: the one place a task's completion marker is written
MARKER_READERS = {"status.py"}  # counts the markers of a work area (`llmkit status`)


def marker_writers(sources: dict[str, str]) -> list[str]:
    """Where code other than the driver seals a task (calls `seal`) or spells a marker's name
    (a string holding `.done`): `file:line`."""
    found = []
    for name, text in sources.items():
        if name == MARKER_WRITER:
            continue
        for node in ast.walk(ast.parse(text)):
            seals = isinstance(node, ast.Call) and "seal" in (getattr(node.func, "id", None),
                                                              getattr(node.func, "attr", None))
            spells = (isinstance(node, ast.Constant) and isinstance(node.value, str)
                      and ".done" in node.value and name not in MARKER_READERS
                      and not _is_docstring(node, text))
            if seals or spells:
                found.append(f"{name}:{node.lineno}")
    return found


def _is_docstring(node, text: str) -> bool:
    line = text.splitlines()[node.lineno - 1].lstrip()
    return line.startswith(('"""', "'''")) or node.value.count("\n") > 0


def test_no_code_but_the_driver_writes_a_task_completion_marker():
    sources = {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8")
               for p in PACKAGE.rglob("*.py")}
    assert marker_writers(sources) == []
    planted = {"data/planted.py": "from llmkit.core.durable import seal\n\n"
                                  "def finish(tasks, k):\n    seal(tasks.marker(k), [], {})\n",
               "data/spelled.py": "def marker(root, k):\n    return root / f'part-{k}.done'\n"}
    assert marker_writers(planted) == ["data/planted.py:4", "data/spelled.py:2"]
