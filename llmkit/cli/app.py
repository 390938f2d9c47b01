"""`llmkit` — the explicit table of commands. Importing this must not import torch."""

import importlib

import typer

# command name -> "module:function"; every stage of DESIGN.md, in pipeline order
COMMANDS = {
    "ingest": "llmkit.cli.ingest:ingest",
    "clean": "llmkit.cli.clean:clean",
    "dedup": "llmkit.cli.dedup:dedup",
    "ppl-filter": "llmkit.cli.ppl_filter:ppl_filter",
    "tokenizer": "llmkit.cli.tokenizer:tokenizer",
    "tokenize": "llmkit.cli.tokenize:tokenize",
    "pretrain": "llmkit.cli.pretrain:pretrain",
    "sft": "llmkit.cli.sft:sft",
    "rm": "llmkit.cli.rm:rm",
    "dpo": "llmkit.cli.dpo:dpo",
    "ppo": "llmkit.cli.ppo:ppo",
    "eval": "llmkit.cli.eval:eval_",
    "generate": "llmkit.cli.generate:generate",
    "export": "llmkit.cli.export:export",
    "import": "llmkit.cli.import_:import_",
    "report": "llmkit.cli.report:report",
    "status": "llmkit.cli.status:status",
}


def build_app() -> typer.Typer:
    app = typer.Typer(
        help="llmkit: from raw text to an aligned language model, one stage at a time.",
        no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
        rich_markup_mode=None)
    for name, target in COMMANDS.items():
        module, func = target.split(":")
        try:
            fn = getattr(importlib.import_module(module), func)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue  # stage not built yet
        app.command(name, help=fn.__doc__)(fn)
    return app


def main() -> None:
    build_app()()
