"""The package keeps the shape its structure issue gave it: small cohesive modules, and training
stages that only name their parts (train.stage.fit_stage owns the skeleton)."""

import ast
from pathlib import Path

import pytest

import llmkit
from llmkit.stages import TRAINING

PACKAGE = Path(llmkit.__file__).parent
MAX_MODULE_LINES = 500
MAX_STAGE_FUNCTION_LINES = 20


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, long


@pytest.mark.parametrize("stage", TRAINING)
def test_each_training_stage_function_only_names_its_parts(stage):
    tree = ast.parse((PACKAGE / "train" / f"{stage}.py").read_text(encoding="utf-8"))
    run = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == f"run_{stage}")
    assert run.end_lineno - run.lineno + 1 <= MAX_STAGE_FUNCTION_LINES
    assert any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == "fit_stage" for c in ast.walk(run))
