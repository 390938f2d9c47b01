from typing import Annotated

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_tokenize = deferred("llmkit.data.tokenize:run_tokenize")


@stage_command(config=True, inputs=True, writes=True, workers=True, sharded=True, rows=True)
def tokenize(
    ctx,
    tokenizer: Annotated[str, typer.Option(help="Tokenizer artifact name or path.")] = "tokenizer",
):
    """Tokenize dataset(s) (--in, default dedup) into token shards with a val split -> `tokens`."""
    run_tokenize(ctx, ctx.config(), tokenizer)
