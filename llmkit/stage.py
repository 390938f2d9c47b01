"""What every stage receives from the command line, independent of typer."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from llmkit.config import load_recipe, parse_overrides, resolve_config
from llmkit.errors import UserError
from llmkit.recipes import TRAINING, check_recipe, check_section_names
from llmkit.workspace import Artifact, Workspace


@dataclass
class StageContext:
    workspace: Workspace
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
               force=False, workers=1, rank=None, world_size=None) -> "StageContext":
        root = workspace or os.environ.get("LLMKIT_WORKSPACE") or "workspace"
        if workers is not None and workers < 1:
            raise UserError(f"--workers must be ≥ 1, got {workers}")
        if (rank is None) != (world_size is None):
            raise UserError("--rank and --world-size go together")
        if rank is not None and not 0 <= rank < world_size:
            raise UserError(f"--rank must be in [0, {world_size}), got {rank}")
        recipe_data = load_recipe(recipe)
        check_section_names(recipe_data, str(recipe))
        return cls(Workspace(Path(root)), recipe_data, parse_overrides(set_),
                   list(inputs or []), out, force, workers or 1, rank, world_size, str(recipe))

    def config(self, cls, section: str, **flags):
        """Defaults < recipe[section] < the stage's own command-line flags < --set. A training
        stage first checks the whole recipe, so that a setting that would stop a later stage
        is found before hours of training, not after."""
        if section in TRAINING and self.recipe:
            check_recipe(self.recipe, self.recipe_path)
        return resolve_config(cls, self.recipe.get(section), flags, self.overrides)

    def input(self, default: str) -> Artifact:
        if len(self.inputs) > 1:
            raise UserError(f"this stage reads one input, got --in {' '.join(self.inputs)}")
        return self.workspace.artifact(self.inputs[0] if self.inputs else default)

    def input_list(self, default: str) -> list[Artifact]:
        return [self.workspace.artifact(n) for n in (self.inputs or [default])]

    def out_name(self, default: str) -> str:
        return self.out or default
