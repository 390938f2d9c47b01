from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

run_ingest = deferred("llmkit.data.ingest:run_ingest")


@stage_command(config=True, writes=True, workers=True, sharded=True, rows=True)
def ingest(
    ctx,
    paths: Annotated[list[str], typer.Argument(help="Files, directories or globs.")],
    kind: Annotated[Optional[str], typer.Option(help="text | sft | preference | prompt | feedback")] = None,
    text_field: Annotated[Optional[str], typer.Option(help="Field holding the text.")] = None,
    id_field: Annotated[Optional[str], typer.Option(help="Field holding the id.")] = None,
    source: Annotated[Optional[str], typer.Option(help="Source name (default: file stem).")] = None,
    per_line: Annotated[bool, typer.Option("--per-line", help="txt: a document per line.")] = False,
):
    """Read jsonl/json/txt/csv/parquet and WARC/WET/HTML (.gz/.zst) into dataset `raw`; bad records quarantined."""
    flags = {"kind": kind, "text_field": text_field, "id_field": id_field, "source": source,
             "per_line": per_line or None}
    cfg = ctx.config(**{k: v for k, v in flags.items() if v is not None})
    run_ingest(ctx, paths, cfg)
