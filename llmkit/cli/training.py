"""The one command body of the training stages.

A trainer's `cli/<stage>.py` names its own options (`Opt`), its `plan_<stage>` (`--dry-run`) and
its `run_<stage>`; `training_command` makes the command that parses them, with --recipe/--set,
--in, --out/--force and --dry-run, and calls one or the other. The trainers differ in names and
options only, so their commands are one function, not a copy each.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Callable, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.cli.dry_run import DryRun
from llmkit.stages import BY_COMMAND


@dataclass(frozen=True)
class Opt:
    """A trainer's option taking a name or path: `run_<stage>` takes it as keyword `to`,
    `plan_<stage>` by position, in the order the command lists its options."""
    flag: str                  # --from
    help: str
    to: str                    # run_<stage>'s keyword
    default: str | None = None

    @property
    def name(self) -> str:
        return self.flag.lstrip("-") + "_"  # the parameter: `from` and `eval` are Python words


POLICY = Opt("--from", "Policy checkpoint run (or step folder) to train, e.g. sft.", "base", "sft")
REF = Opt("--ref", "Reference checkpoint (default: --from).", "ref")


def held_out(what: str) -> Opt:
    """--eval: the held-out dataset a trainer measures before and after training."""
    return Opt("--eval", f"{what} (default: a share of --in).", "eval_data")


def training_command(stage: str, plan: Callable, run: Callable, doc: str, *options: Opt):
    """The typer command of training stage `stage` (its CLI function in the stage table)."""
    def command(ctx, dry_run: bool = False, **given):
        cfg = ctx.config()
        values = [given[o.name] for o in options]
        if dry_run:
            return plan(ctx, cfg, *values)
        run(ctx, cfg, **{o.to: v for o, v in zip(options, values)})

    command.__module__, command.__name__ = BY_COMMAND[stage].cli.split(":")
    command.__qualname__, command.__doc__ = command.__name__, doc
    command.__signature__ = inspect.Signature(
        [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default,
                             annotation=Annotated[Optional[str], typer.Option(o.flag, help=o.help)])
           for o in options]
        + [inspect.Parameter("dry_run", inspect.Parameter.KEYWORD_ONLY, default=False,
                             annotation=DryRun)])
    return stage_command(config=True, inputs=True, writes=True)(command)
