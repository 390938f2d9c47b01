"""`llmkit`: a typer app of the commands of the stage table (llmkit.stages), in its order.
Importing this must not import torch."""

import importlib
import itertools
import logging
import os
import re
import sys
from typing import Annotated

import typer
from typer.core import TyperCommand

from llmkit.core.keydocs import documented_keys
from llmkit.stages import BY_COMMAND, STAGES
from llmkit.version import __version__


class StageHelp(TyperCommand):
    """A command whose --help ends with the keys of its stage's config (`section`)."""

    section = ""

    def format_epilog(self, ctx, formatter) -> None:
        super().format_epilog(ctx, formatter)
        formatter.write("\n" + config_keys_help(self.section))


def config_keys_help(section: str, longest_default: int = 40) -> str:
    """The keys of a stage's config, one a line: `key: type = default  # comment`, nested
    sections as `model.n_layers`. Read from the config class's source, so torch is not imported."""
    rows = []
    for doc in documented_keys(BY_COMMAND[section].config):
        default = doc.default
        if len(default) > longest_default and default[0] in "[{":
            default = default[:longest_default].rsplit(", ", 1)[0] + ", …" + default[-1]
        rows.append((f"{doc.key}: {doc.type}" + ("" if doc.section else f" = {default}"),
                     doc.comment))
    width = min(max(len(left) for left, _ in rows), 52)
    lines = [f"Config keys (--set KEY=VALUE, or the recipe's `{section}:` section;",
             f"`llmkit config {section}` prints the resolved values):"]
    lines += [f"  {left:<{width}}  # {comment}" if comment else f"  {left}" for left, comment in rows]
    return "\n".join(lines) + "\n"


def show_version(value: bool) -> None:
    if value:
        print(f"llmkit {__version__}")
        raise typer.Exit()


# Every command reads local files only, so the network stays shut: huggingface_hub, transformers,
# datasets and peft read these when imported (a later change is not seen), and `kernels` (through
# bitsandbytes, which peft imports) would otherwise ask the hub for a CPU kernel. setdefault: a user
# who sets one keeps control.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "DISABLE_TELEMETRY": "1", "USE_HUB_KERNELS": "NO"}


def work_offline() -> None:
    """The offline switches, before any command imports a model library."""
    for name, value in OFFLINE.items():
        os.environ.setdefault(name, value)
    # offline, bitsandbytes' import looks for the hub kernel in the cache only, and both it and
    # `kernels` warn that it is not there (and to `pip install kernels`): bitsandbytes' own CPU
    # code runs instead, so the warnings only mislead
    if os.environ["HF_HUB_OFFLINE"] == "1":
        for name in ("kernels", "bitsandbytes.backends.cpu.ops"):
            logging.getLogger(name).setLevel(logging.ERROR)


def build_app() -> typer.Typer:
    work_offline()
    app = typer.Typer(
        help="llmkit: from raw text to an aligned language model, one stage at a time.",
        no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
        rich_markup_mode=None)

    @app.callback()
    def options(version: Annotated[bool, typer.Option(
            "--version", callback=show_version, is_eager=True,
            help="Print the version and exit.")] = False) -> None:
        pass

    for stage in STAGES:  # a module that fails to import is an error, never a missing command
        module, func = stage.cli.split(":")
        fn = getattr(importlib.import_module(module), func)
        cls = type(f"{func}_help", (StageHelp,), {"section": stage.command}) if stage.config else None
        app.command(stage.command, help=fn.__doc__, cls=cls)(fn)
    return app


PAIR = re.compile(r"[A-Za-z_][\w.-]*=")  # `key=value`, as --set takes it


def command_line(args: list[str]) -> list[str]:
    """`args` as the commands parse them: without the `--local_rank=N` (or `--local-rank N`)
    that the deepspeed launcher and torch.distributed.launch append, since each process reads
    LOCAL_RANK from its environment; and with `--set a=1 b=2` spelled `--set a=1 --set b=2`."""
    out, in_set, rest = [], False, iter(args)
    for arg in rest:
        name, sep, _ = arg.partition("=")
        if name in ("--local_rank", "--local-rank"):
            if not sep:
                next(rest, None)  # its value
        elif in_set and PAIR.match(arg):
            out += ["--set", arg]
        else:
            out.append(arg)
            in_set = name == "--set"
            if arg == "--set":
                out += itertools.islice(rest, 1)  # its value
    return out


def main(args: list[str] | None = None) -> None:
    build_app()(args=command_line(sys.argv[1:] if args is None else args), prog_name="llmkit")
