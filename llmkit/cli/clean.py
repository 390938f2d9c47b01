from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_clean = deferred("llmkit.data.clean_stage:run_clean")


@stage_command(config=True, inputs=True, writes=True, workers=True, sharded=True, rows=True)
def clean(ctx):
    """Normalise text and remove low-quality rows (Gopher / C4 / FineWeb rules) -> `clean`."""
    run_clean(ctx, ctx.config())
