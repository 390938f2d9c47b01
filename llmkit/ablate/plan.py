"""The runs an experiment needs: one per variant × seed × step, shared where equal.

Each run is the command a user would type (`llmkit pretrain --in tokens --set seed=1 --set
lr_schedule=wsd`) in the user's workspace, reading its inputs there by name, with `--out` the
run's folder inside the ablate artifact (`NAME/runs/wsd-s1`). Two cells whose step resolves to
the same config, the same arguments and the same upstream runs share that run: a step without a
`seed` setting (tokenize) runs once for all seeds, and a variant that changes only a later step
reuses the baseline's earlier ones.
A run is named after the first cell that needs it: `wsd-s1` (one stage) or `wsd-s1-pretrain` (a
chain), so a shared run keeps the name of the baseline or the first seed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from llmkit.ablate.experiment import REFERENCE, Experiment, has_seed, resolved, set_pairs
from llmkit.core.config import dotted_keys
from llmkit.core.targets import MANIFEST
from llmkit.stages import config_class

RUNS = "runs"  # the ablate artifact's workspace of runs


@dataclass
class Run:
    name: str
    step: str
    stage: str
    args: list[str]  # the stage's options, inputs resolved
    settings: list[str]  # its --set pairs, seed first
    needs: list[str] = field(default_factory=list)  # the runs whose artifacts it reads

    def command(self, workspace: Path, runs: Path, extra: list[str] = ()) -> list[str]:
        """The arguments after `llmkit`: an absolute --out is where the run writes, whatever
        folder its stage's artifacts usually go in (eval/)."""
        sets = [a for pair in [*self.settings, *extra] for a in ("--set", pair)]
        return [self.stage, *self.args, "-w", str(workspace), "--out", str(runs / self.name), *sets]


@dataclass
class Plan:
    runs: list[Run]  # in an order that runs what a run needs before it
    cells: dict[tuple[str, int], dict[str, str]]  # (variant, seed) -> step -> its run's name
    inputs: list[Path]  # the user's artifacts the runs read

    def run(self, name: str) -> Run:
        return next(r for r in self.runs if r.name == name)


def make_plan(exp: Experiment, workspace, runs: Path) -> Plan:
    """The runs of `exp` in `workspace` (llmkit.core.workspace.Workspace), writing in `runs`."""
    by_key: dict[str, Run] = {}
    cells: dict[tuple[str, int], dict[str, str]] = {}
    inputs: dict[str, Path] = {}
    for variant in exp.names:
        for seed in exp.seeds:
            upstream: dict[str, Run] = {}
            for step in exp.steps:
                seeded = has_seed(step.stage)
                settings = {**({"seed": seed} if seeded else {}), **exp.settings(variant, step)}
                args = [_resolve_arg(a, upstream, workspace, runs, inputs) for a in exp.args(variant, step)]
                needs = sorted({r.name for name, r in upstream.items()
                                if any(f"{{{name}}}" in a for a in exp.args(variant, step))})
                key = hashlib.sha256(json.dumps(
                    [step.stage, resolved(step.stage, settings), args], sort_keys=True, default=str).encode()).hexdigest()
                if key not in by_key:
                    name = f"{variant}-s{seed}" + (f"-{step.name}" if exp.chain else "")
                    by_key[key] = Run(name, step.name, step.stage, args, set_pairs(settings), needs)
                upstream[step.name] = by_key[key]
            cells[(variant, seed)] = {name: run.name for name, run in upstream.items()}
    return Plan(list(by_key.values()), cells, list(inputs.values()))


def _resolve_arg(arg: str, upstream: dict[str, Run], workspace, runs: Path, inputs: dict[str, Path]) -> str:
    """An earlier step's `{name}` -> its run's folder (absolute); a value naming an artifact of the
    workspace is recorded as an input of the ablation (its fingerprint is the ablation's too)."""
    if REFERENCE.search(arg):
        return REFERENCE.sub(lambda m: str((runs / upstream[m.group(1)].name).resolve()), arg)
    if not arg.startswith("-") and arg and (workspace.named(arg) / MANIFEST).is_file():
        path = workspace.named(arg).resolve()
        inputs.setdefault(str(path), path)
    return arg


def thread_settings(stage: str, threads: int) -> list[str]:
    """`threads=N` for a stage that has the setting (where it runs: no part of a fingerprint)."""
    return [f"threads={threads}"] if threads and "threads" in dotted_keys(config_class(stage)) else []
