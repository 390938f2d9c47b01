from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.cli.dry_run import DryRun
from llmkit.stages import deferred

plan_pretrain = deferred("llmkit.train.pretrain:plan_pretrain")
run_pretrain = deferred("llmkit.train.pretrain:run_pretrain")


@stage_command(config=True, inputs=True, writes=True)
def pretrain(
    ctx,
    from_: Annotated[Optional[str], typer.Option(
        "--from", help="Start from this checkpoint run (its latest step) or step folder: its "
                       "weights and architecture, with a fresh optimizer and schedule.")] = None,
    dry_run: DryRun = False,
):
    """Pretrain a causal LM on token shards (--in, default tokens) -> checkpoint run `pretrain`."""
    cfg = ctx.config()
    if dry_run:
        return plan_pretrain(ctx, cfg, from_)
    run_pretrain(ctx, cfg, from_=from_)
