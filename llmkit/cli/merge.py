from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_merge = deferred("llmkit.merge.stage:run_merge")


@stage_command(config=True, writes=True)
def merge(
    ctx,
    from_: Annotated[list[str], typer.Option(
        "--from", help="Models to merge, comma-separated (runs, imported models, LoRA runs, step folders); "
                       "with --method average, one run whose last step folders are averaged.")],
    method: Annotated[Optional[str], typer.Option(
        "--method", help="linear, slerp, task_arithmetic, ties, dare_ties, dare_linear or average "
                         "(--set method=…).")] = None,
    base: Annotated[Optional[str], typer.Option(
        "--base", help="The model the others were fine-tuned from (slerp, task_arithmetic, ties, dare).")] = None,
):
    """Merge models of one shape and tokenizer into a checkpoint run (--out NAME, default merged)."""
    cfg = ctx.config(**({"method": method} if method is not None else {}))
    run_merge(ctx, cfg, from_, base)
