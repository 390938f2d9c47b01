from typing import Annotated

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_report = deferred("llmkit.report:run_report")


@stage_command(config=True)
def report(ctx, runs: Annotated[list[str], typer.Argument(help="Checkpoint runs (names or paths).")]):
    """PNG plots of loss, lr, grad norm, tokens/s, MFU, reward/KL/margins + a markdown summary."""
    run_report(ctx, runs, ctx.config())
