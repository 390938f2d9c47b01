"""Recipes: YAML with one section per stage, checked against the stage table (llmkit.stages).

A section named after a stage (`pretrain:`) configures that stage. Any other section configures
the runs of one stage that write the artifact of its name, and says which stage with a `stage:`
key: the demo's second pretrain run, `llmkit pretrain --out scorer`, reads

    scorer:
      stage: pretrain
      model: {preset: small, hidden_size: 128, n_layers: 2}

instead of `pretrain:` (the two are not merged). A section that is neither is an error naming it.
"""

from __future__ import annotations

import difflib

from llmkit.core.config import resolve_config
from llmkit.errors import ConfigError
from llmkit.stages import CONFIGURED, TRAINING, config_class

STAGE_KEY = "stage"  # in an artifact's section: the stage whose runs read it


def section_stage(name: str, values, path="recipe") -> str:
    """The stage that recipe section `name` configures: its name, or its `stage:`."""
    if name in CONFIGURED:
        return name
    stage = values.get(STAGE_KEY) if isinstance(values, dict) else None
    if stage is None:
        close = difflib.get_close_matches(str(name), CONFIGURED, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{path}: unknown section {name!r}{hint} (a section for the runs "
                          f"`--out {name}` of a stage names it: `{STAGE_KEY}: STAGE`)")
    if stage not in CONFIGURED:
        close = difflib.get_close_matches(str(stage), CONFIGURED, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"choose one of {', '.join(CONFIGURED)}"
        raise ConfigError(f"{path} [{name}]: {STAGE_KEY}: {stage!r} is no stage with settings; {hint}")
    return stage


def section_settings(name: str, values) -> dict | None:
    """A section's config values: without the `stage:` that names an artifact section's stage."""
    if name in CONFIGURED or not isinstance(values, dict):
        return values
    return {k: v for k, v in values.items() if k != STAGE_KEY}


def section_for(recipe: dict, stage: str, out: str | None) -> str:
    """The section a run of `stage` writing artifact `out` reads: `out:` when the recipe has it
    for this stage, else the stage's own."""
    if out in recipe and out not in CONFIGURED and section_stage(out, recipe[out]) == stage:
        return out
    return stage


def check_section_names(recipe: dict, path="recipe") -> None:
    for name, values in recipe.items():
        section_stage(name, values, path)


def check_recipe(recipe: dict, path="recipe") -> dict:
    """Every section resolved against its stage's config, then the stages against each other:
    errors name the section and key."""
    check_section_names(recipe, path)
    resolved = {}
    for section, values in recipe.items():
        stage = section_stage(section, values, path)
        try:
            resolved[section] = resolve_config(config_class(stage), section_settings(section, values))
        except ConfigError as e:
            raise ConfigError(f"{path} [{section}]: {e}") from None
    problems = pipeline_problems(resolved)
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    return resolved


def pipeline_problems(resolved: dict) -> list[str]:
    """What would stop a later stage of the recipe's pipeline, found before the first one runs:
    every training stage starts from the model `pretrain` builds, so each one's sequences must
    fit its positions and the tokenizer's vocabulary its embedding."""
    if "pretrain" not in resolved:
        return []  # the model comes from elsewhere (--from an imported run): nothing to check here
    vocab = resolved["tokenizer"].vocab_size if "tokenizer" in resolved else None
    model = resolved["pretrain"].model.build(vocab or 32000)
    problems = [f"[{stage}] seq_len={resolved[stage].seq_len} exceeds the model's max_seq_len="
                f"{model.max_seq_len} (pretrain.model); lower {stage}.seq_len or raise "
                "pretrain.model.max_seq_len" for stage in TRAINING
                if stage in resolved and resolved[stage].seq_len > model.max_seq_len]
    if vocab and model.vocab_size < vocab:
        problems.append(f"[tokenizer] vocab_size={vocab} exceeds pretrain.model.vocab_size="
                        f"{model.vocab_size}; drop pretrain.model.vocab_size or raise it")
    return problems
