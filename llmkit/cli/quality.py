from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_quality = deferred("llmkit.data.quality:run_quality")


def _specs(values: Optional[list[str]]) -> list[str]:
    return [v for value in values or [] for v in value.split(",") if v]


@stage_command(config=True, inputs=True, writes=True, workers=True, sharded=True, rows=True)
def quality(
    ctx,
    good: Annotated[Optional[list[str]], typer.Option(
        "--good", help="Good examples: datasets or .jsonl/.json/.parquet files with `text` "
                       "(repeatable or comma-separated).")] = None,
    bad: Annotated[Optional[list[str]], typer.Option(
        "--bad", help="Bad examples (spam, boilerplate…), as --good.")] = None,
    labels: Annotated[Optional[list[str]], typer.Option(
        "--labels", help="Examples labelled by a column (--set label_column=, label_threshold=).")
    ] = None,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="The classifier artifact: trained under this name when examples are "
                        "given, else one trained before (default quality_model).")] = None,
    encoder: Annotated[Optional[str], typer.Option(
        "--encoder", help="--set backend=hidden: the checkpoint run (llmkit or imported) whose "
                          "mean-pooled hidden states the classifier reads.")] = None,
    train_only: Annotated[bool, typer.Option(
        "--train-only", help="Train the classifier (--model) and stop.")] = False,
):
    """Train a document-quality classifier offline from labelled examples; score --in (default dedup), keep the best -> `quality`."""
    run_quality(ctx, ctx.config(), good=_specs(good), bad=_specs(bad), labels=_specs(labels),
                model=model, encoder=encoder, train_only=train_only)
