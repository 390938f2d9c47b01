from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.stages import deferred

find_in_workspace = deferred("llmkit.checkpoints.loading:find_in_workspace")
run_import = deferred("llmkit.hf.import_:run_import")


@stage_command(config=True, writes=True)
def import_(
    ctx,
    from_: Annotated[str, typer.Option(
        "--from", help="Transformers model folder (Llama 3.x, SmolLM2, Qwen2/2.5, Qwen3, Mistral, "
                       "Mixtral): an artifact name such as export/hf, or a path; or a .gguf file.")],
    tokenizer: Annotated[Optional[str], typer.Option(
        "--tokenizer", help="Tokenizer folder (name or path) to use instead of the model's own tokenizer.model / "
             "tokenizer.json.")] = None,
):
    """Turn a transformers folder into a checkpoint run (--out NAME, default imported) to fine-tune."""
    cfg = ctx.config()  # settings first: a wrong key is named before anything is read
    source = find_in_workspace(ctx.workspace, from_, "transformers folder",
                               "give the folder save_pretrained wrote, or the name `llmkit export` wrote")
    run_import(ctx, cfg, source, tokenizer)
