from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_dedup = deferred("llmkit.data.dedup.stage:run_dedup")


@stage_command(config=True, inputs=True, writes=True, workers=True, sharded=True, rows=True)
def dedup(
    ctx,
    method: Annotated[Optional[str], typer.Option(
        help="exact | simhash | minhash (default minhash).")] = None,
    phase: Annotated[Optional[str], typer.Option(
        help="Run only signatures | buckets | clusters | filter (with --rank: this rank's "
             "tasks of it). A plain run afterwards assembles the artifact.")] = None,
):
    """Remove exact / SimHash / MinHash duplicates, keeping the first of each cluster -> `dedup`."""
    cfg = ctx.config(**({"method": method} if method else {}))
    run_dedup(ctx, cfg, phase=phase)
