from typing import Annotated

import typer

from llmkit.cli.common import stage_command


@stage_command(config=True, inputs=True, writes=True)
def extend_vocab(
    ctx,
    from_: Annotated[str, typer.Option(
        "--from", help="Model run (name or path) with a byte-level BPE tokenizer.json: an imported Qwen, "
                       "Llama 3, SmolLM2.")],
):
    """Train new pieces of one script (--set script=han) on a corpus (--in, default dedup), add them to a
    model's tokenizer and embedding -> a model run (--out NAME, default extended)."""
    from llmkit.hf.vocab_extend import run_extend_vocab

    run_extend_vocab(ctx, ctx.config(), from_)
