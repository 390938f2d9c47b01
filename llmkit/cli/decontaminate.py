from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_decontaminate = deferred("llmkit.data.decontam:run_decontaminate")


@stage_command(config=True, inputs=True, writes=True, workers=True, sharded=True, rows=True)
def decontaminate(
    ctx,
    against: Annotated[Optional[str], typer.Option(
        "--against", help="Evaluation files (jsonl / json / parquet, as `llmkit eval` reads them) "
                          "or datasets, comma-separated (--set against=[...] in a recipe).")] = None,
):
    """Remove (or excise) documents that contain n-grams of evaluation items (--in, default filtered) -> `decontaminated`."""
    run_decontaminate(ctx, ctx.config(), against=against)
