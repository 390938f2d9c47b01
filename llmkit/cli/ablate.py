from pathlib import Path
from typing import Annotated

import typer

from llmkit.cli.app import main
from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_ablate = deferred("llmkit.ablate.stage:run_ablate")


@stage_command(config=True, writes=True)
def ablate(ctx, experiment: Annotated[Path, typer.Argument(
        help="Experiment YAML: stage (or steps), args, baseline, variants, seeds, metric.")]):
    """Run every variant × seed of an experiment through its stage -> results.json, a table and plots
    with t-intervals (--out NAME, default ablate; --set processes=N runs N at once)."""
    run_ablate(ctx, ctx.config(), experiment, main)
