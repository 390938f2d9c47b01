from typing import Annotated

import typer

from llmkit.cli.common import stage_command


@stage_command(config=True, writes=True)
def eval_(
    ctx,
    from_: Annotated[str, typer.Option(
        "--from", help="Checkpoint run to evaluate (its latest step), or one of its step-* folders.")
    ] = "pretrain",
):
    """Evaluate a checkpoint: perplexity, multiple choice, BLEU/ROUGE, reward accuracy / win rate, speed -> `eval/<name>`."""
    from llmkit.eval.stage import run_eval

    run_eval(ctx, ctx.config(), run=from_)
