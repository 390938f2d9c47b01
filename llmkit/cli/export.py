import sys
from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.errors import UserError
from llmkit.stages import deferred
from llmkit.hf.ship_check import ShipCheckFailed, summary

run_export = deferred("llmkit.hf.export:run_export")


@stage_command(config=True, writes=True)
def export(
    ctx,
    from_: Annotated[str, typer.Option("--from", help="Checkpoint run or step folder (name or path).")],
    to: Annotated[Optional[str], typer.Option(
        "--to", help="Output folder (default: WORKSPACE/export/<format>, or WORKSPACE/<--out>).")] = None,
    format_: Annotated[Optional[str], typer.Option(
        "--format", help="Output format: hf (a transformers folder) or gguf (one file for llama.cpp).")] = None,
    quant: Annotated[Optional[str], typer.Option(
        "--quant", help="GGUF weights: f16, bf16, q8_0, q4_0, q4_1, or a K-quant mix q2_k, q3_k_s, q3_k_m, q3_k_l, "
                "q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k (default f16; --set imatrix=FILE for an importance matrix).")] = None,
    check: Annotated[bool, typer.Option(
        "--check", help="GGUF: run the file through llama.cpp's chat path (replies stop, template, greedy "
                        "agreement; --set ship_check=true); exit 1 when it fails.")] = False,
):
    """Write a checkpoint as a Hugging Face transformers folder or a GGUF file and record its logit parity."""
    flags = {k: v for k, v in (("format", format_), ("quant", quant), ("ship_check", check or None)) if v is not None}
    cfg = ctx.config(**flags)
    if cfg.format != "gguf" and (quant is not None or cfg.quant != type(cfg).quant):  # given, not the default
        raise UserError(f"--quant / quant={cfg.quant} sets the weights of a GGUF file, and this export writes a "
                        f"transformers folder (format {cfg.format}): add --format gguf, or drop --quant "
                        "(a transformers folder's weights: --set dtype=bfloat16, float16 or float32)")

    try:
        run_export(ctx, cfg, from_, to)
    except ShipCheckFailed as e:
        print(f"error: {e.path.name} failed the ship check (nothing written; --set ship_check=false writes it "
              "unchecked):", file=sys.stderr)
        if "stops" in e.record:
            print(f"  {summary(e.record)}", file=sys.stderr)
        for failure in e.failures:
            print(f"  - {failure}", file=sys.stderr)
        raise typer.Exit(1) from None
