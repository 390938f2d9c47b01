from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_synth = deferred("llmkit.synth.stage:run_synth")


@stage_command(config=True, inputs=True, writes=True, workers=True, sharded=True, rows=True)
def synth(
    ctx,
    from_: Annotated[Optional[str], typer.Option(
        "--from", help="The model that writes the rows: a run, step folder or imported model "
                       "(or --set server.url=http://… for an OpenAI-compatible server).")] = None,
    kind: Annotated[Optional[str], typer.Option(
        "--kind", help="instructions (Magpie, --set rows=N) | answers (--in prompts) | qa (--in "
                       "documents) | rephrase (--in documents) | pairs (--in prompts).")] = None,
):
    """Make data with a model: Magpie instructions, answers, grounded QA, rephrasings, judged pairs -> an sft / preference / text dataset (`synth_<kind>`)."""
    run_synth(ctx, ctx.config(**({"kind": kind} if kind is not None else {})), from_)
