from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_tokenizer = deferred("llmkit.data.train_tokenizer:run_tokenizer")


@stage_command(config=True, inputs=True, writes=True, workers=True)
def tokenizer(
    ctx,
    vocab_size: Annotated[Optional[int], typer.Option(help="Vocabulary size.")] = None,
):
    """Train a sentencepiece BPE tokenizer on dataset(s) (--in, default dedup) -> `tokenizer`."""
    flags = {"vocab_size": vocab_size} if vocab_size is not None else {}
    run_tokenizer(ctx, ctx.config(**flags))
