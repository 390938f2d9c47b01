"""What every stage receives from the command line, independent of typer."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from llmkit.core.config import load_recipe, parse_overrides, resolve_config
from llmkit.errors import UserError
from llmkit.core.executor import RunsOn
from llmkit.core.recipes import check_recipe, check_section_names, section_for, section_settings
from llmkit.stages import BY_COMMAND, TRAINING, config_class
from llmkit.core.targets import check_target
from llmkit.core.workspace import Artifact, Workspace


@dataclass
class StageContext:
    workspace: Workspace
    stage: str | None = None                       # the running command (llmkit.stages)
    recipe: dict = field(default_factory=dict)     # the whole recipe (one section per stage)
    overrides: dict = field(default_factory=dict)  # parsed --set values
    inputs: list[str] = field(default_factory=list)  # --in values, names or paths
    out: str | None = None                         # --out
    force: bool = False                            # --force
    # config values that common options gave: --allow-empty, and a data stage's `run` section
    # (--executor, --workers, --rank, --world-size); the flags layer of `config()`
    flags: dict = field(default_factory=dict)
    recipe_path: str = "recipe"                    # --recipe, for messages

    @classmethod
    def create(cls, workspace=None, recipe=None, set_=None, inputs=None, out=None,
               force=False, stage=None, flags=None) -> "StageContext":
        root = workspace or os.environ.get("LLMKIT_WORKSPACE") or "workspace"
        flags = flags or {}
        resolve_config(RunsOn, flags.get("run"))  # a wrong flag fails before anything is read
        recipe_data = load_recipe(recipe)
        check_section_names(recipe_data, str(recipe))
        ctx = cls(Workspace(Path(root)), stage, recipe_data, parse_overrides(set_),
                  list(inputs or []), out, force, flags, str(recipe))
        if out is not None and stage in BY_COMMAND:
            ctx.check_out()
        return ctx

    def check_out(self) -> None:
        """Refuse an --out that must not be replaced (llmkit.core.targets) before anything is read;
        the artifact's builder checks again, knowing the kind it builds and its inputs."""
        path = self.workspace.path(BY_COMMAND[self.stage].folder) / self.out
        check_target(path, root=self.workspace.root, stage=self.stage, force=self.force,
                     inputs=[self.workspace.named(name) for name in self.inputs], shown=self.out)
        if os.path.normpath(self.out) == ".":  # eval's folder itself: every report is in there
            raise UserError(f"--out {self.out!r} names no artifact; give it a name")

    def config(self, cls=None, stage: str | None = None, **flags):
        """The config of `stage` (default: the running command's, of class `cls` from the stage
        table): defaults < its recipe section < the command's own flags < --set. The section is
        the one of the artifact this run writes (`--out NAME` and a `NAME:` section for this
        stage), else the stage's. A training stage first checks the whole recipe, so that a
        setting that would stop a later stage is found before hours of training, not after."""
        stage = stage or self.stage
        cls = cls or config_class(stage)
        if stage in TRAINING and self.recipe:
            check_recipe(self.recipe, self.recipe_path)
        given = {k: v for k, v in self.flags.items() if k in {f.name for f in fields(cls)}}
        return resolve_config(cls, self.recipe_section(stage), {**given, **flags},
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
