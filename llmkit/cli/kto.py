from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.cli.dry_run import DryRun
from llmkit.stages import deferred

plan_kto = deferred("llmkit.train.kto:plan_kto")
run_kto = deferred("llmkit.train.kto:run_kto")


@stage_command(config=True, inputs=True, writes=True)
def kto(
    ctx,
    from_: Annotated[str, typer.Option(
        "--from", help="Policy checkpoint run (or step folder) to train, e.g. sft.")] = "sft",
    ref: Annotated[Optional[str], typer.Option(
        "--ref", help="Reference checkpoint (default: --from).")] = None,
    eval_: Annotated[Optional[str], typer.Option(
        "--eval", help="Held-out feedback dataset; its desirable completions are scored by exact "
                       "match before/after (default: a share of --in).")] = None,
    dry_run: DryRun = False,
):
    """Kahneman-Tversky optimisation on unpaired feedback: prompt, completion, label true/false (--in, default feedback_train) -> `kto`."""
    cfg = ctx.config()
    if dry_run:
        return plan_kto(ctx, cfg, from_, ref, eval_)
    run_kto(ctx, cfg, base=from_, ref=ref, eval_data=eval_)
