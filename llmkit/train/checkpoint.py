"""A checkpoint run's lifecycle: whether a (re)start continues the run, rewinds it or starts it
over (`plan_run`), what it records of its settings (`run.json`), and how every process enters it
(`training_run`). The step-folder format itself (names, completeness, pruning, weights, RNG
states, safe loading) is `llmkit.checkpoints.step_folders`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from pathlib import Path

from llmkit.checkpoints.step_folders import LATEST, is_complete, step_dir_name, step_dirs, step_of
from llmkit.errors import ConfigError
from llmkit.train.distributed import barrier, setup_distributed
from llmkit.train.metrics import METRICS_FILE
from llmkit.core.durable import write_atomic

# -- the run folder as a workspace artifact ----------------------------------------------------
#
# A complete checkpoint is never deleted without --force: running again with changed settings
# continues the run when only the settings in `TrainConfig.CONTINUABLE` changed (how far and how
# fast it goes on), and is refused, naming the keys, when anything that makes it another run
# changed (model, data, tokenizer, batch shape). --force starts the run over, or, with
# resume_from naming an older step, rewinds it there (the later checkpoints are replaced).

RUN_RECORD = "run.json"  # in a run dir: the settings and inputs it was last started with
LEGACY_RUN_FINGERPRINT = "run_fingerprint"  # what earlier versions kept instead of run.json


@dataclasses.dataclass
class RunPlan:
    """What a (re)start does with its run folder."""

    resume: bool  # continue the checkpoints in the folder (False: clear it and start fresh)
    step: int | None = None  # the step it continues from
    rewound: list = dataclasses.field(default_factory=list)  # later checkpoints it retrains (--force)
    changes: dict = dataclasses.field(default_factory=dict)  # {key: [old, new]} of this restart
    history: list = dataclasses.field(default_factory=list)  # every earlier restart's changes

    @property
    def change_record(self) -> dict:
        return {"step": self.step, "changes": self.changes}


def open_run(ctx, stage: str, cfg, inputs: list):
    """(Builder of a checkpoint run, its RunPlan); the plan is None when the run is up to date.
    Raises ConfigError, before anything is touched, when the folder holds another run."""
    # resume_from picks where a run continues; it must not make it look like another run
    b = ctx.workspace.builder(ctx.out_name(stage), stage=stage,
                              config=dataclasses.replace(cfg, resume_from=None), inputs=inputs,
                              force=ctx.force, in_place=True)
    if b.up_to_date:
        return b, None
    defaults = _flat(dataclasses.asdict(type(cfg)()))
    return b, plan_run(b, cfg.resume_from, type(cfg).CONTINUABLE, ctx.force, defaults)


def plan_run(b, resume_from: str | None, continuable: frozenset, force: bool,
             defaults: dict | None = None) -> RunPlan:
    """Continue, rewind (resume_from an older step, with --force) or start fresh; see above.
    A setting the run's record lacks (one a later llmkit added, such as lora.r or model.head_dim)
    is unchanged while it has its default in `defaults` (flat keys): it is what the run had. One
    the record has and this llmkit no longer has (ppo's top_k) cannot have been set now: no change."""
    complete = [p for p in step_dirs(b.final) if is_complete(p)]
    if not complete or (force and not resume_from):
        return RunPlan(resume=False)
    record = _read_run_record(b.final)
    if record is None:
        legacy = b.final / LEGACY_RUN_FINGERPRINT
        if legacy.is_file() and legacy.read_text().strip() == b.fingerprint:
            record = {"config": b.config, "inputs": _input_record(b)}
        else:
            raise _another_run(b, ["(unknown: the folder does not record its settings)"])
    old, new = _flat(record["config"]), _flat(b.config)
    defaults = defaults or {}
    added = {k for k in new.keys() - old.keys() if k in defaults and new[k] == defaults[k]}
    changed = sorted(k for k in new.keys() - added if old.get(k) != new.get(k))
    fixed = [k for k in changed if k.split(".")[0] not in continuable]
    # inputs compare by fingerprint, in order: a copied or moved workspace is the same run
    old_inputs = [i["fingerprint"] for i in record["inputs"]]
    fixed += [f"input {a.path}" for n, a in enumerate(b.inputs)
              if n >= len(old_inputs) or old_inputs[n] != a.fingerprint]
    if fixed:
        raise _another_run(b, fixed)
    start = b.final / resume_from if resume_from else complete[-1]
    if start not in complete:
        names = ", ".join(p.name for p in complete)
        raise ConfigError(f"cannot resume from {start}: it is not a complete checkpoint of {b.final} "
                          f"(complete: {names}); pick one of those or drop resume_from")
    step = step_of(start)
    if new["max_steps"] < step:
        raise ConfigError(f"{b.final} is at step {step}, past max_steps={new['max_steps']}; raise "
                          f"max_steps, or rewind with resume_from=step-… and --force")
    later = [p for p in complete if step_of(p) > step]
    if later and not force:
        raise ConfigError(f"resume_from={start.name} rewinds {b.final}: its later checkpoints "
                          f"({', '.join(p.name for p in later)}) would be retrained and replaced. Add "
                          f"--force to rewind, or branch off with --out NEW --from {start}")
    return RunPlan(True, step, later, {k: [old.get(k), new.get(k)] for k in changed},
                   record.get("changes", []))


def start_run(b, plan: RunPlan) -> None:
    """Inside `with b:` — clear the run dir for a fresh run, or record a restart's changed
    settings (run.json, the manifest, and a `config_change` event in metrics.jsonl)."""
    history = plan.history
    if not plan.resume:
        for p in b.dir.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    if plan.rewound:  # one history per run folder: the abandoned branch's checkpoints go
        for p in plan.rewound:
            shutil.rmtree(p)
        write_atomic(b.dir / LATEST, step_dir_name(plan.step) + "\n")
        print(f"{b.name}: rewound to step {plan.step}; removed {', '.join(p.name for p in plan.rewound)}")
    if plan.changes:
        history = [*history, plan.change_record]
        with open(b.dir / METRICS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": "config_change", **plan.change_record}) + "\n")
        print(f"{b.name}: continuing from step {plan.step} with " +
              ", ".join(f"{k} {old} -> {new}" for k, (old, new) in plan.changes.items()))
    if history:
        b.extra["config_changes"] = history
    (b.dir / LEGACY_RUN_FINGERPRINT).unlink(missing_ok=True)
    write_atomic(b.dir / RUN_RECORD, json.dumps(
        {"config": b.config, "inputs": _input_record(b), "changes": history}, indent=2, default=str))


def _read_run_record(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / RUN_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _input_record(b) -> list[dict]:
    return [{"path": str(a.path), "fingerprint": a.fingerprint} for a in b.inputs]


def _flat(config: dict, prefix: str = "") -> dict:
    """{"model.hidden_size": 32, ...}: nested sections as dotted keys, as --set spells them."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _another_run(b, keys: list[str]) -> ConfigError:
    shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
    return ConfigError(
        f"{b.final} holds a run trained with other settings ({shown}); those cannot change within "
        f"a run. Train a new one with --out NEW (--from {b.name} starts it from these weights), "
        f"start this one over with --force (its checkpoints are deleted), or put the settings back")


@contextlib.contextmanager
def training_run(b, plan: RunPlan):
    """Every process of a training run enters this: the main one holds the builder (lock,
    manifest written on success) and starts the run dir (`start_run`) before the others go on.
    Yields the process's DistEnv."""
    dist = setup_distributed()
    if not dist.is_main:
        barrier()
        yield dist
        return
    with b:
        start_run(b, plan)
        barrier()
        yield dist
