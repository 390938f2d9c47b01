"""What every stage receives from the command line, independent of typer."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from llmkit.config import load_recipe, parse_overrides, resolve_config
from llmkit.errors import UserError
from llmkit.recipes import check_recipe, check_section_names, section_for, section_settings
from llmkit.stages import TRAINING, config_class
from llmkit.workspace import Artifact, Workspace


@dataclass
class StageContext:
    workspace: Workspace
    stage: str | None = None                       # the running command (llmkit.stages)
    recipe: dict = field(default_factory=dict)     # the whole recipe (one section per stage)
    overrides: dict = field(default_factory=dict)  # parsed --set values
    inputs: list[str] = field(default_factory=list)  # --in values, names or paths
    out: str | None = None                         # --out
    force: bool = False                            # --force
    workers: int = 1                               # --workers
    rank: int | None = None                        # --rank (one task of many)
    world_size: int | None = None                  # --world-size
    recipe_path: str = "recipe"                    # --recipe, for messages

    @classmethod
    def create(cls, workspace=None, recipe=None, set_=None, inputs=None, out=None,
               force=False, workers=1, rank=None, world_size=None, stage=None) -> "StageContext":
        root = workspace or os.environ.get("LLMKIT_WORKSPACE") or "workspace"
        if workers is not None and workers < 1:
            raise UserError(f"--workers must be ≥ 1, got {workers}")
        if (rank is None) != (world_size is None):
            raise UserError("--rank and --world-size go together")
        if rank is not None and not 0 <= rank < world_size:
            raise UserError(f"--rank must be in [0, {world_size}), got {rank}")
        recipe_data = load_recipe(recipe)
        check_section_names(recipe_data, str(recipe))
        return cls(Workspace(Path(root)), stage, recipe_data, parse_overrides(set_),
                   list(inputs or []), out, force, workers or 1, rank, world_size, str(recipe))

    def config(self, cls=None, stage: str | None = None, **flags):
        """The config of `stage` (default: the running command's, of class `cls` from the stage
        table): defaults < its recipe section < the command's own flags < --set. The section is
        the one of the artifact this run writes (`--out NAME` and a `NAME:` section for this
        stage), else the stage's. A training stage first checks the whole recipe, so that a
        setting that would stop a later stage is found before hours of training, not after."""
        stage = stage or self.stage
        if stage in TRAINING and self.recipe:
            check_recipe(self.recipe, self.recipe_path)
        return resolve_config(cls or config_class(stage), self.recipe_section(stage), flags,
                              self.overrides)

    def recipe_section(self, stage: str) -> dict | None:
        """The recipe values a run of `stage` reads (see `config`)."""
        section = section_for(self.recipe, stage, self.out)
        return section_settings(section, self.recipe.get(section))

    def input(self, default: str) -> Artifact:
        if len(self.inputs) > 1:
            raise UserError(f"this stage reads one input, got --in {' '.join(self.inputs)}")
        return self.workspace.artifact(self.inputs[0] if self.inputs else default)

    def input_list(self, default: str) -> list[Artifact]:
        return [self.workspace.artifact(n) for n in (self.inputs or [default])]

    def out_name(self, default: str) -> str:
        return self.out or default
