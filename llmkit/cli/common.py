"""Options every stage shares, and the wrapper that turns them into a StageContext.

A stage command is written as `def clean(ctx: StageContext, <its own options>)`; the
`stage_command` decorator adds the common options it uses to its signature (so each stage does
not repeat them), tells the context which stage runs (the stage table, llmkit.stages, names the
function), so that `ctx.config()` reads that stage's config and recipe section, and converts user
errors into exit code 2 with a one-line message.
"""

import dataclasses
import functools
import inspect
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmkit.errors import UserError
from llmkit.core.context import StageContext
from llmkit.stages import stage_of_function
from llmkit.core.workspace import Workspace

WORKSPACE = [
    ("workspace", Annotated[Optional[Path], typer.Option(
        "--workspace", "-w", envvar="LLMKIT_WORKSPACE", show_default="./workspace",
        help="Workspace directory.")], None),
]
CONFIG = [
    ("recipe", Annotated[Optional[Path], typer.Option(
        "--recipe", help="Recipe YAML, one section per stage.")], None),
    ("set_", Annotated[Optional[list[str]], typer.Option(
        "--set", help="Config override key=value (repeatable, or several pairs after one "
                      "--set; dotted keys for sections).")], None),
]
INPUTS = [
    ("in_", Annotated[Optional[list[str]], typer.Option(
        "--in", help="Input artifact name or path (repeatable where a stage reads several).")],
     None),
]
WRITES = [
    ("out", Annotated[Optional[str], typer.Option("--out", help="Output artifact name.")], None),
    ("force", Annotated[bool, typer.Option("--force", help="Rebuild even if up to date.")],
     False),
]
WORKERS = [
    ("workers", Annotated[Optional[int], typer.Option(
        "--workers", show_default="1", help="Local worker processes (--set run.workers=…).")],
     None),
]
EMPTY = [
    ("allow_empty", Annotated[bool, typer.Option(
        "--allow-empty", help="Write an empty output instead of exiting 2 (--set allow_empty=true).")],
     False),
]
SHARDING = [
    ("rank", Annotated[Optional[int], typer.Option(
        "--rank", help="This task's index when the stage is split into --world-size tasks.")],
     None),
    ("world_size", Annotated[Optional[int], typer.Option(
        "--world-size", help="Number of tasks the stage is split into (Slurm array…).")], None),
    ("executor", Annotated[Optional[str], typer.Option(
        "--executor", help="Where the tasks run: local | ray (--set run.executor=…; Ray's "
                           "settings: --set run.ray.address=auto …).")], None),
]
RUN_OPTIONS = ("executor", "workers", "rank", "world_size")  # a data stage's `run` section


def stage_command(fn=None, *, config: bool = False, inputs: bool = False, writes: bool = False,
                  workers: bool = False, sharded: bool = False, rows: bool = False):
    """Give `fn(ctx, **own_options)` the common options it uses and clean error handling.

    Every command takes --workspace; the flags add --recipe/--set (`config`), --in (`inputs`),
    --out/--force (`writes`), --workers, --rank/--world-size/--executor (`sharded`: a stage made
    of tasks) and --allow-empty (`rows`: a data stage), so that `--help` lists only options that
    change what the command does."""
    if fn is None:
        return functools.partial(stage_command, config=config, inputs=inputs, writes=writes,
                                 workers=workers, sharded=sharded, rows=rows)
    found = stage_of_function(f"{fn.__module__}:{fn.__name__}")  # what `ctx.config()` reads
    stage = found.command if found else None
    groups = [(config, CONFIG), (inputs, INPUTS), (writes, WRITES), (workers, WORKERS),
              (sharded, SHARDING), (rows, EMPTY)]
    extra = WORKSPACE + [option for on, group in groups if on for option in group]
    own = [p for p in inspect.signature(fn).parameters.values() if p.name != "ctx"]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                               annotation=ann) for name, ann, default in extra]

    @functools.wraps(fn)
    def command(**kwargs):
        common = {name: kwargs.pop(name) for name, _, _ in extra}
        with user_errors():
            ctx = StageContext.create(
                workspace=common["workspace"], recipe=common.get("recipe"),
                set_=common.get("set_"), inputs=common.get("in_"), out=common.get("out"),
                force=common.get("force", False), stage=stage, flags=config_flags(common))
            return fn(absolute_paths(ctx) if sharded else ctx, **kwargs)

    del command.__wrapped__  # typer must see the new signature, not fn's
    command.__signature__ = inspect.Signature(own + added)
    command.__annotations__ = {p.name: p.annotation for p in own + added}
    return command


def config_flags(common: dict) -> dict:
    """The config values the common options gave, as the flags layer of the stage's config:
    --allow-empty, and --executor/--workers/--rank/--world-size as the `run` section."""
    run = {name: common[name] for name in RUN_OPTIONS if common.get(name) is not None}
    return {**({"allow_empty": True} if common.get("allow_empty") else {}),
            **({"run": run} if run else {})}


def absolute_paths(ctx):
    """`ctx` with its workspace and its --in paths absolute. A stage made of tasks hands them
    paths that may be read elsewhere: a Ray worker's working directory is where its cluster was
    started, not here. --in names stay names (looked up in the workspace)."""
    def absolute(name: str) -> str:
        return os.path.abspath(name) if os.sep in name else name

    return dataclasses.replace(ctx, workspace=Workspace(os.path.abspath(ctx.workspace.root)),
                               inputs=[absolute(name) for name in ctx.inputs])


class user_errors:
    """Exit 2 with the message for UserError; exit 130 on Ctrl-C; let real bugs raise."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, UserError):
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(2)
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):  # TrainingInterrupted too
            print(f"interrupted: {exc}" if str(exc) else "interrupted", file=sys.stderr)
            raise typer.Exit(130)
        if exc_type is not None and issubclass(exc_type, OSError) and exc.errno == 28:
            print(f"error: disk full while writing ({exc}); free space and re-run — "
                  "earlier artifacts are intact", file=sys.stderr)
            raise typer.Exit(2)
        return False
