from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command


@stage_command(config=True, inputs=True, writes=True)
def rm(
    ctx,
    from_: Annotated[str, typer.Option(
        "--from", help="Checkpoint run (or step folder) whose trunk the reward model starts "
                       "from, e.g. sft.")] = "sft",
    eval_: Annotated[Optional[str], typer.Option(
        "--eval", help="Held-out preference dataset for pairwise accuracy (default: a share "
                       "of --in).")] = None,
):
    """Reward model on preference pairs (--in, default pref_train), Bradley-Terry loss -> `rm`."""
    from llmkit.train.rm import RmConfig, run_rm

    run_rm(ctx, ctx.config(RmConfig, "rm"), base=from_, eval_data=eval_)
