from llmkit.cli.common import stage_command


@stage_command(config=True, inputs=True, writes=True, workers=True, sharded=True, rows=True)
def clean(ctx):
    """Normalise text and remove low-quality rows (Gopher / C4 / FineWeb rules) -> `clean`."""
    from llmkit.data.clean import clean_batch
    from llmkit.data.pipeline import run_map_stage

    cfg = ctx.config()
    run_map_stage(ctx, stage="clean", config=cfg, process_batch=clean_batch,
                  input_default="raw", out_default="clean")
