from pathlib import Path
from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

read_prompts = deferred("llmkit.generation:read_prompts")
run_generate = deferred("llmkit.generation:run_generate")


@stage_command(config=True)
def generate(
    ctx,
    from_: Annotated[str, typer.Option("--from", help="Checkpoint run or step folder (name or path).")],
    prompt: Annotated[Optional[list[str]], typer.Option("--prompt", help="A prompt (repeatable).")] = None,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="File of prompts: .jsonl with `prompt` (or `messages`), else one per line.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", help="Also write the generations as jsonl.")] = None,
):
    """Complete prompts with a checkpoint (KV cache); --set temperature=0.7 top_k=50 greedy=true; sft/dpo/ppo runs and imported models whose tokenizer has a chat template get it unless --set chat=false."""
    cfg = ctx.config()
    texts = list(prompt or []) + (read_prompts(prompts) if prompts is not None else [])
    run_generate(ctx, cfg, from_, texts, output)
