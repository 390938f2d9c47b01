"""`llmkit config <stage>`: the resolved config as a recipe section, each value marked with
where it came from."""

import yaml
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.core.config import load_recipe, parse_overrides, resolve_config
from llmkit.train.pretrain import PretrainConfig


def llmkit(*args, expect=0):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == expect, r.output
    return r.output


def test_printed_config_marks_sources_and_resolves_back_to_itself(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("pretrain:\n  lr: 0.001\n  max_steps: 50\n  model:\n    preset: tiny\n"
                      "sft:\n  lr: 0.5\n  seq_len: 128\n")
    pairs = ["max_steps=20", "model.n_layers=2", "mixture_weights.web=0.5"]
    sets = [a for p in pairs for a in ("--set", p)]
    out = llmkit("config", "pretrain", "--recipe", recipe, *sets, "-w", tmp_path / "ws")
    lines = out.splitlines()
    assert lines[0] == "pretrain:"
    for expected in ["  lr: 0.001  # recipe", "  max_steps: 20  # set", "  warmup_steps: 2  # default",
                     "  micro_batch_size: 8  # default", "    preset: tiny  # recipe",
                     "    n_layers: 2  # set", "  mixture_weights: {web: 0.5}  # set", "  model:"]:
        assert expected in lines, out
    assert not (tmp_path / "ws").exists()  # nothing written

    resolved = resolve_config(PretrainConfig, load_recipe(recipe)["pretrain"], parse_overrides(pairs))
    assert resolve_config(PretrainConfig, yaml.safe_load(out)["pretrain"]) == resolved
    printed = tmp_path / "printed.yaml"
    printed.write_text(out)  # fed back as a recipe, every value now comes from it
    again = llmkit("config", "pretrain", "--recipe", printed)
    assert again == out.replace("# set", "# recipe").replace("# default", "# recipe")


def test_every_stage_prints_a_config_and_a_typo_is_named(tmp_path):
    from llmkit.stages import CONFIGURED

    for stage in CONFIGURED:
        assert llmkit("config", stage).startswith(f"{stage}:\n")
    assert "did you mean 'pretrain'" in llmkit("config", "pretrian", expect=2)
    assert "did you mean 'max_steps'" in llmkit("config", "sft", "--set", "max_step=3", expect=2)
