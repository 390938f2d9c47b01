"""Every shipped recipe is tested data: each section parses against its stage's config."""

import json
from pathlib import Path

import pytest

from llmkit.core.config import load_recipe
from llmkit.errors import ConfigError
from llmkit.core.recipes import check_recipe
from llmkit.stages import CONFIGURED, STAGES

RECIPES = sorted(Path(__file__).resolve().parents[2].glob("recipes/*/recipe.yaml"))


def test_there_are_recipes_for_cpu_and_gpu():
    assert {p.parent.name for p in RECIPES} >= {"demo", "smol-135m", "1b"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.parent.name)
def test_recipe_parses_against_the_stage_configs(path):
    resolved = check_recipe(load_recipe(path), str(path))
    assert resolved  # every recipe configures at least one stage


def test_every_configurable_command_has_a_config_class():
    assert set(CONFIGURED) == {s.command for s in STAGES} - {"status", "config"}


def test_a_typo_in_a_recipe_names_the_section_and_key():
    with pytest.raises(ConfigError, match=r"unknown section 'pretrian'.*'pretrain'"):
        check_recipe({"pretrian": {}})
    with pytest.raises(ConfigError, match=r"\[pretrain\].*'max_step'.*'max_steps'"):
        check_recipe({"pretrain": {"max_step": 3}})


def test_a_recipe_whose_later_stage_cannot_run_is_refused_before_training(tmp_path):
    from typer.testing import CliRunner

    from llmkit.cli.app import build_app

    recipe = {"pretrain": {"model": {"preset": "tiny", "max_seq_len": 64}, "seq_len": 64},
              "sft": {"seq_len": 128}}
    with pytest.raises(ConfigError, match=r"\[sft\] seq_len=128 exceeds the model's max_seq_len=64"):
        check_recipe(recipe)
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    result = CliRunner().invoke(build_app(), ["pretrain", "-w", str(tmp_path / "ws"), "--recipe", str(path)])
    assert result.exit_code == 2 and "[sft] seq_len=128" in result.output  # before any input is read
    assert not (tmp_path / "ws").exists()
