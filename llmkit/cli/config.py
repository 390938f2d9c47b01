import dataclasses
import difflib
from typing import Annotated

import typer

from llmkit.cli.common import stage_command
from llmkit.core.config import config_yaml, value_sources
from llmkit.errors import UserError
from llmkit.core.recipes import section_stage
from llmkit.stages import CONFIGURED, config_class


@stage_command(config=True)
def config(
    ctx,
    section: Annotated[str, typer.Argument(
        metavar="STAGE",
        help="The stage whose settings are printed: ingest, clean, …, pretrain, sft, rm, dpo, ppo, "
             "eval, …; or a recipe section of one artifact (`scorer`, with `stage: pretrain`).",
        show_default=False)],
):
    """Print a stage's resolved config (defaults < recipe < --set) as a recipe section, each value
    marked `# default`, `# recipe` or `# set`."""
    if section not in CONFIGURED and section not in ctx.recipe:
        close = difflib.get_close_matches(section, CONFIGURED, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"choose one of {', '.join(CONFIGURED)}"
        raise UserError(f"no stage {section!r} has a config; {hint}")
    stage = section_stage(section, ctx.recipe.get(section), ctx.recipe_path)
    ctx = dataclasses.replace(ctx, out=section)  # as the run that writes `section` reads it
    cls = config_class(stage)
    cfg = ctx.config(cls, stage)
    sources = value_sources(cls, {"recipe": ctx.recipe_section(stage), "set": ctx.overrides})
    print(config_yaml(cfg, section, sources, stage=None if section == stage else stage), end="")
