from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_eval = deferred("llmkit.eval.stage:run_eval")
split_task_names = deferred("llmkit.eval.stage:split_task_names")


@stage_command(config=True, writes=True)
def eval_(
    ctx,
    from_: Annotated[str, typer.Option(
        "--from", help="Checkpoint run to evaluate (its latest step), or one of its step-* folders.")
    ] = "pretrain",
    tasks: Annotated[Optional[str], typer.Option(
        "--tasks", help="Tasks, comma-separated: llmkit's own (ppl, choice, generation, reward, efficiency) "
                        "and lm-evaluation-harness tasks (mmlu_local, cmmlu_local, ceval_local, a "
                        "harness.include_path task, any lm-eval task whose data is local).")] = None,
):
    """Evaluate a checkpoint: perplexity, multiple choice, BLEU/ROUGE, reward accuracy / win rate, speed, lm-eval tasks -> `eval/<name>`."""
    run_eval(ctx, ctx.config(**(split_task_names(tasks) if tasks else {})), run=from_)
