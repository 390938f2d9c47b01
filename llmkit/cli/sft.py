from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command


@stage_command(config=True, inputs=True, writes=True)
def sft(
    ctx,
    from_: Annotated[str, typer.Option(
        "--from", help="Checkpoint run (or step folder) to fine-tune, e.g. pretrain.")] = "pretrain",
    eval_: Annotated[Optional[str], typer.Option(
        "--eval", help="Held-out SFT dataset scored by exact match before/after (default: a "
                       "share of --in).")] = None,
):
    """Supervised fine-tuning on chats (--in, default sft_train), loss on assistant turns -> `sft`."""
    from llmkit.train.sft import SftConfig, run_sft

    run_sft(ctx, ctx.config(SftConfig, "sft"), base=from_, eval_data=eval_)
