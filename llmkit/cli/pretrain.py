from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command


@stage_command(config=True, inputs=True, writes=True)
def pretrain(
    ctx,
    from_: Annotated[Optional[str], typer.Option(
        "--from", help="Start from this checkpoint run (its latest step) or step folder: its "
                       "weights and architecture, with a fresh optimizer and schedule.")] = None,
):
    """Pretrain a causal LM on token shards (--in, default tokens) -> checkpoint run `pretrain`."""
    from llmkit.train.pretrain import PretrainConfig, run_pretrain

    run_pretrain(ctx, ctx.config(PretrainConfig, "pretrain"), from_=from_)
