"""`--dry-run` of the training stages: the option. Each trainer's plan (what its run would do,
printed, nothing written) is `plan_<stage>` beside its `run_<stage>` in llmkit.train; what the
plans share is llmkit.train.planning."""

from __future__ import annotations

from typing import Annotated

import typer

DryRun = Annotated[bool, typer.Option(
    "--dry-run", help="Print what the run would do (parameters, tokens, steps, memory per device, "
                      "checkpoint size) and exit without writing anything.")]
