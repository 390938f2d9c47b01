from typing import Annotated

import typer

from llmkit.cli.common import stage_command


@stage_command(config=True)
def config(
    ctx,
    stage: Annotated[str, typer.Argument(
        help="The stage whose settings are printed: ingest, clean, …, pretrain, sft, rm, dpo, ppo, "
             "eval, …", show_default=False)],
):
    """Print a stage's resolved config (defaults < recipe < --set) as a recipe section, each value
    marked `# default`, `# recipe` or `# set`."""
    import difflib

    from llmkit.config import config_yaml, value_sources
    from llmkit.errors import UserError
    from llmkit.recipes import STAGE_CONFIGS, config_class

    if stage not in STAGE_CONFIGS:
        close = difflib.get_close_matches(stage, list(STAGE_CONFIGS), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"choose one of {', '.join(STAGE_CONFIGS)}"
        raise UserError(f"no stage {stage!r} has a config; {hint}")
    cls = config_class(stage)
    cfg = ctx.config(cls, stage)
    sources = value_sources(cls, {"recipe": ctx.recipe.get(stage), "set": ctx.overrides})
    print(config_yaml(cfg, stage, sources), end="")
