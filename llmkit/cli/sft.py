from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.cli.dry_run import DryRun
from llmkit.stages import deferred

plan_sft = deferred("llmkit.train.sft:plan_sft")
run_sft = deferred("llmkit.train.sft:run_sft")


@stage_command(config=True, inputs=True, writes=True)
def sft(
    ctx,
    from_: Annotated[str, typer.Option(
        "--from", help="Checkpoint run (or step folder) to fine-tune, e.g. pretrain.")] = "pretrain",
    eval_: Annotated[Optional[str], typer.Option(
        "--eval", help="Held-out SFT dataset scored by exact match before/after (default: a "
                       "share of --in).")] = None,
    dry_run: DryRun = False,
):
    """Supervised fine-tuning on chats (--in, default sft_train), loss on assistant turns -> `sft`."""
    cfg = ctx.config()
    if dry_run:
        return plan_sft(ctx, cfg, from_, eval_)
    run_sft(ctx, cfg, base=from_, eval_data=eval_)
