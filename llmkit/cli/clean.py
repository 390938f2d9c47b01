from llmkit.cli.common import stage_command


@stage_command(config=True, inputs=True, writes=True, workers=True, sharded=True, rows=True)
def clean(ctx):
    """Normalise text and remove low-quality rows (Gopher / C4 / FineWeb rules) -> `clean`."""
    from llmkit.data.clean_stage import run_clean

    run_clean(ctx, ctx.config())
