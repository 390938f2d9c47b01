from typing import Annotated

import typer

from llmkit.cli.common import stage_command


@stage_command(config=True, inputs=True, writes=True, workers=True, sharded=True, rows=True)
def tokenize(
    ctx,
    tokenizer: Annotated[str, typer.Option(help="Tokenizer artifact name or path.")] = "tokenizer",
):
    """Tokenize dataset(s) (--in, default dedup) into token shards with a val split -> `tokens`."""
    from llmkit.data.tokenize import run_tokenize

    run_tokenize(ctx, ctx.config(), tokenizer)
