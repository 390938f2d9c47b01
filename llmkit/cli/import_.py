from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command


@stage_command
def import_(
    ctx,
    from_: Annotated[str, typer.Option("--from", help="Local transformers model folder (Llama/Mistral/Mixtral).")],
    tokenizer: Annotated[Optional[str], typer.Option(
        "--tokenizer", help="llmkit tokenizer (name or path) when the folder has no usable tokenizer.model.")] = None,
):
    """Turn a transformers folder into a checkpoint run (--out NAME, default imported) to fine-tune."""
    from llmkit.hf import ImportConfig, run_import

    run_import(ctx, ctx.config(ImportConfig, "import"), from_, tokenizer)
