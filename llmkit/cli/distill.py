from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.errors import UserError


@stage_command(config=True, inputs=True, writes=True)
def distill(
    ctx,
    teacher: Annotated[Optional[str], typer.Option(
        "--teacher", help="Teacher checkpoint run (or step folder), e.g. dpo; it must use the "
                          "student's tokenizer.")] = None,
    from_: Annotated[Optional[str], typer.Option(
        "--from", help="Student checkpoint run (or step folder) to train, e.g. a smaller "
                       "pretrain run.")] = None,
    eval_: Annotated[Optional[str], typer.Option(
        "--eval", help="Held-out SFT dataset scored by exact match before/after, and the "
                       "teacher on it (default: a share of --in).")] = None,
):
    """Knowledge distillation (forward_kl/reverse_kl/jsd, top-k teacher, on-policy) of --teacher into --from on chats or prompts (--in, default sft_train) -> `distill`."""
    from llmkit.train.distill import run_distill

    cfg = ctx.config()
    missing = [name for name, value in (("--teacher", teacher), ("--from", from_)) if not value]
    if missing:
        raise UserError(f"llmkit distill needs {' and '.join(missing)}: the teacher run and the "
                        "student run, e.g. `llmkit distill --teacher dpo --from student`")
    run_distill(ctx, cfg, teacher=teacher, base=from_, eval_data=eval_)
