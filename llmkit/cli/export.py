from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command


@stage_command(config=True, writes=True)
def export(
    ctx,
    from_: Annotated[str, typer.Option("--from", help="Checkpoint run or step folder (name or path).")],
    to: Annotated[Optional[str], typer.Option(
        "--to", help="Output folder (default: WORKSPACE/export/hf, or WORKSPACE/<--out>).")] = None,
    format_: Annotated[Optional[str], typer.Option("--format", help="Output format: hf.")] = None,
):
    """Write a checkpoint as a Hugging Face transformers folder and record its logit parity."""
    from llmkit.hf.export import run_export

    flags = {"format": format_} if format_ is not None else {}
    run_export(ctx, ctx.config(**flags), from_, to)
