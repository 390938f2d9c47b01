from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.cli.dry_run import DryRun
from llmkit.stages import deferred

plan_rm = deferred("llmkit.train.rm:plan_rm")
run_rm = deferred("llmkit.train.rm:run_rm")


@stage_command(config=True, inputs=True, writes=True)
def rm(
    ctx,
    from_: Annotated[str, typer.Option(
        "--from", help="Checkpoint run (or step folder) whose trunk the reward model starts "
                       "from, e.g. sft.")] = "sft",
    eval_: Annotated[Optional[str], typer.Option(
        "--eval", help="Held-out preference dataset for pairwise accuracy (default: a share "
                       "of --in).")] = None,
    dry_run: DryRun = False,
):
    """Reward model on preference pairs (--in, default pref_train), Bradley-Terry loss -> `rm`."""
    cfg = ctx.config()
    if dry_run:
        return plan_rm(ctx, cfg, from_, eval_)
    run_rm(ctx, cfg, base=from_, eval_data=eval_)
