from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_ppl_filter = deferred("llmkit.data.ppl_filter:run_ppl_filter")


@stage_command(config=True, inputs=True, writes=True, workers=True, sharded=True, rows=True)
def ppl_filter(
    ctx,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="Scoring language model: a checkpoint run or one of its step-* folders "
                        "(not needed with --set backend=kenlm).")] = None,
):
    """Score documents (--in, default dedup) with a reference LM; drop the least natural (CCNet buckets or max_ppl) -> `filtered`."""
    run_ppl_filter(ctx, ctx.config(), model=model)
