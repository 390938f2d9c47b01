from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.cli.dry_run import DryRun
from llmkit.stages import deferred

plan_dpo = deferred("llmkit.train.dpo:plan_dpo")
run_dpo = deferred("llmkit.train.dpo:run_dpo")


@stage_command(config=True, inputs=True, writes=True)
def dpo(
    ctx,
    from_: Annotated[str, typer.Option(
        "--from", help="Policy checkpoint run (or step folder) to train, e.g. sft.")] = "sft",
    ref: Annotated[Optional[str], typer.Option(
        "--ref", help="Reference checkpoint (default: --from).")] = None,
    eval_: Annotated[Optional[str], typer.Option(
        "--eval", help="Held-out preference dataset, scored by exact match before/after "
                       "(default: a share of --in).")] = None,
    dry_run: DryRun = False,
):
    """Direct preference optimisation (sigmoid/ipo/cdpo/robust/reference_free; orpo/simpo without a reference model) on pairs (--in, default pref_train) -> `dpo`."""
    cfg = ctx.config()
    if dry_run:
        return plan_dpo(ctx, cfg, from_, ref, eval_)
    run_dpo(ctx, cfg, base=from_, ref=ref, eval_data=eval_)
