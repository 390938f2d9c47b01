"""An ablation's experiment file, read and checked before anything runs.

One stage::

    stage: pretrain
    args: [--in, tokens]              # the stage's options, as on its command line
    baseline: {max_steps: 300, model: {preset: tiny}}
    variants:                         # name -> settings over the baseline's
      wsd: {lr_schedule: wsd}
      masked: {lr_schedule: wsd, doc_masking: true}
      other_data: {args: [--in, tokens_b]}   # another input artifact
    seeds: [0, 1, 2]                  # or a count: 3 is [0, 1, 2]
    metric: val_loss                  # a key of the run's manifest stats (or a list of them)

A chain of stages lists `steps:` instead (each a stage, its args, its baseline and an optional
`name`); a later step's args name an earlier step's artifact as `{name}`, a variant's settings are
per step (`{pretrain: {lr_schedule: wsd}}`) and a metric names its step as `step:key` (default:
the last step's). Every setting is checked against its stage's config class here, as `--set`
would receive it, so a typo fails before hours of training.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from llmkit.core.config import (config_to_dict, dotted_items, dotted_keys, parse_overrides, resolve_config,
                                 yaml_value)
from llmkit.core.executor import RUN_OPTION
from llmkit.errors import ConfigError, UserError
from llmkit.stages import BY_COMMAND, config_class

BASELINE = "baseline"  # the name the baseline's runs carry
# the stages ablate does not run: they write no artifact a metric could be read from, or run ablate
NOT_ABLATABLE = {"ablate", "report", "judge", "generate"}
TOP_KEYS = ("stage", "args", "baseline", "steps", "variants", "seeds", "metric")
STEP_KEYS = ("stage", "name", "args", "baseline")
# options ablate gives each run itself (its workspace, output and settings)
OWN_OPTIONS = ("-w", "--workspace", "--out", "--set", "--recipe", "--force")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
REFERENCE = re.compile(r"\{([A-Za-z0-9_.-]+)\}")


@dataclass
class AblateConfig:
    processes: int = field(default=1, metadata=RUN_OPTION)  # runs trained at once: 1 in this process, N > 1 in a pool of N local worker processes
    threads: int = field(default=0, metadata=RUN_OPTION)  # CPU threads of each run (--set threads=N); 0 = the run's own choice (its cores / processes when several)
    confidence: float = 0.95  # of the Student t intervals over seeds (each variant's mean, its paired difference to the baseline)

    def __post_init__(self):
        if self.processes < 1:
            raise ConfigError(f"processes must be >= 1, got {self.processes}")
        if self.threads < 0:
            raise ConfigError(f"threads must be >= 0, got {self.threads}")
        if not 0 < self.confidence < 1:
            raise ConfigError(f"confidence must be in (0, 1), got {self.confidence}")


@dataclass(frozen=True)
class Step:
    name: str  # how variants, references and metrics name it
    stage: str
    args: tuple[str, ...]
    baseline: dict


@dataclass
class Experiment:
    path: Path
    steps: list[Step]
    variants: dict[str, dict[str, dict]]  # variant -> step name -> its overrides ("args" replaces the step's)
    seeds: list[int]
    metrics: list[tuple[str, str]]  # (step name, stats key)

    @property
    def names(self) -> list[str]:
        return [BASELINE, *self.variants]

    @property
    def chain(self) -> bool:
        return len(self.steps) > 1

    def overrides(self, variant: str, step: Step) -> dict:
        return {} if variant == BASELINE else self.variants[variant].get(step.name, {})

    def settings(self, variant: str, step: Step) -> dict:
        """The step's settings in `variant`: the baseline's updated by the variant's."""
        merged = _merged(step.baseline, {k: v for k, v in self.overrides(variant, step).items() if k != "args"})
        return merged

    def args(self, variant: str, step: Step) -> tuple[str, ...]:
        return tuple(self.overrides(variant, step).get("args", step.args))

    def record(self) -> dict:
        """What the ablate artifact's fingerprint hashes: the experiment as read (not where the file is)."""
        return {"steps": [{"name": s.name, "stage": s.stage, "args": list(s.args), "baseline": s.baseline}
                          for s in self.steps],
                "variants": self.variants, "seeds": self.seeds,
                "metrics": [metric_label(self, m) for m in self.metrics]}


def metric_label(exp: Experiment, metric: tuple[str, str]) -> str:
    return f"{metric[0]}:{metric[1]}" if exp.chain else metric[1]


def _merged(base: dict, new: dict) -> dict:
    out = dict(base)
    for k, v in new.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def set_pairs(settings: dict) -> list[str]:
    """`{model: {n_layers: 2}, lr_schedule: wsd}` -> ["model.n_layers=2", "lr_schedule=wsd"]: the
    settings as `--set` pairs (a string as written, any other value as one line of YAML)."""
    return [f"{key}={value if isinstance(value, str) else yaml_value(value)}"
            for key, value in dotted_items(settings)]


def resolved(stage: str, settings: dict) -> dict:
    """The stage's config from `settings` as its command line would build it (defaults < --set),
    as the fingerprint hashes it."""
    return config_to_dict(resolve_config(config_class(stage), parse_overrides(set_pairs(settings))),
                          fingerprint=True)


def has_seed(stage: str) -> bool:
    return "seed" in dotted_keys(config_class(stage))


def read_experiment(path: Path) -> Experiment:
    """The experiment in `path`, checked; a UserError naming the file and the key otherwise."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UserError(f"experiment file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid YAML: {e}") from None
    where = str(path)
    if not isinstance(data, dict):
        raise UserError(f"{where} must be a mapping (stage, args, baseline, variants, seeds, metric)")
    _known(data, TOP_KEYS, where)
    if "steps" in data and "stage" in data:
        raise UserError(f"{where}: give `stage` (one stage) or `steps` (a chain), not both")
    raw_steps = data.get("steps") if "steps" in data else [
        {k: data[k] for k in ("stage", "args", "baseline") if k in data}]
    if not isinstance(raw_steps, list) or not raw_steps:
        raise UserError(f"{where}: `steps` must be a list of stages, each with stage, args and baseline")
    steps = []
    for i, raw in enumerate(raw_steps):
        steps.append(_step(raw, f"{where}: steps[{i}]" if "steps" in data else where, [s.name for s in steps]))
    exp = Experiment(path, steps, _variants(data.get("variants"), steps, where), _seeds(data.get("seeds"), where),
                     _metrics(data.get("metric"), steps, where))
    if len(exp.seeds) > 1 and not any(has_seed(s.stage) for s in steps):
        raise UserError(f"{where}: seeds lists {len(exp.seeds)} seeds, but no stage of it has a `seed` "
                        "setting: every seed would repeat the same run; give one seed")
    _check_settings(exp, where)
    return exp


def _known(data: dict, keys: tuple, where: str) -> None:
    for key in data:
        if key not in keys:
            close = difflib.get_close_matches(str(key), keys, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(keys)}"
            raise UserError(f"{where}: unknown key {key!r}; {hint}")


def _step(raw, where: str, earlier: list[str]) -> Step:
    if not isinstance(raw, dict):
        raise UserError(f"{where} must be a mapping with stage, args and baseline")
    _known(raw, STEP_KEYS, where)
    stage = raw.get("stage")
    ablatable = [s.command for s in BY_COMMAND.values() if s.config and s.command not in NOT_ABLATABLE]
    if stage not in ablatable:
        close = difflib.get_close_matches(str(stage), ablatable, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(f"{where}: unknown stage {stage!r}; {hint}ablate runs {', '.join(ablatable)}")
    name = str(raw.get("name", stage))
    if not NAME.match(name) or name == BASELINE or name in earlier:
        raise UserError(f"{where}: step name {name!r} is taken or not a plain name; give each step its own `name`")
    args = raw.get("args", [])
    if isinstance(args, str):
        args = args.split()
    if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
        raise UserError(f"{where}: args must be a list of the stage's options, e.g. [--in, tokens]")
    args = tuple(str(a) for a in args)
    _check_args(args, earlier, where)
    baseline = raw.get("baseline") or {}
    if not isinstance(baseline, dict):
        raise UserError(f"{where}: baseline must be a mapping of settings (key: value)")
    return Step(name, stage, args, baseline)


def _check_args(args: tuple[str, ...], earlier: list[str], where: str) -> None:
    for a in args:
        if a.split("=", 1)[0] in OWN_OPTIONS:
            raise UserError(f"{where}: args give {a.split('=', 1)[0]}, which ablate sets for each run; "
                            "put settings in baseline or a variant")
        for ref in REFERENCE.findall(a):
            if ref not in earlier:
                raise UserError(f"{where}: args name {{{ref}}}, which is no earlier step "
                                f"({', '.join(earlier) or 'this is the first step'})")


def _variants(raw, steps: list[Step], where: str) -> dict[str, dict[str, dict]]:
    if not isinstance(raw, dict) or not raw:
        raise UserError(f"{where}: variants must be a mapping of name -> settings over the baseline, "
                        "e.g. {wsd: {lr_schedule: wsd}}")
    names = [s.name for s in steps]
    out = {}
    for name, overrides in raw.items():
        name = str(name)
        if not NAME.match(name) or name == BASELINE:
            raise UserError(f"{where}: variant name {name!r} must be a plain folder name other than {BASELINE!r}")
        overrides = overrides or {}
        if not isinstance(overrides, dict):
            raise UserError(f"{where}: variant {name!r} must be a mapping of settings")
        if len(steps) == 1:
            overrides = {names[0]: overrides}
        for step, part in overrides.items():
            if step not in names:
                raise UserError(f"{where}: variant {name!r} names step {step!r}; the steps are {', '.join(names)}")
            if not isinstance(part, dict):
                raise UserError(f"{where}: variant {name!r}, step {step!r} must be a mapping of settings")
            if "args" in part:
                args = part["args"].split() if isinstance(part["args"], str) else part["args"]
                if not isinstance(args, list):
                    raise UserError(f"{where}: variant {name!r}: args must be a list of the stage's options")
                part = {**part, "args": [str(a) for a in args]}
                _check_args(tuple(part["args"]), names[:names.index(step)], f"{where}: variant {name!r}")
            overrides[step] = part
        out[name] = overrides
    return out


def _seeds(raw, where: str) -> list[int]:
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 1:
            raise UserError(f"{where}: seeds is {raw}; give a count >= 1 or a list of seeds, e.g. [0, 1, 2]")
        return list(range(raw))
    if not isinstance(raw, list) or not raw or not all(isinstance(s, int) and not isinstance(s, bool) for s in raw):
        raise UserError(f"{where}: seeds must be a non-empty list of integers or a count >= 1, got {raw!r}")
    if len(set(raw)) != len(raw):
        raise UserError(f"{where}: seeds lists a seed twice: {raw}")
    return list(raw)


def _metrics(raw, steps: list[Step], where: str) -> list[tuple[str, str]]:
    raw = [raw] if isinstance(raw, str) else raw
    if not isinstance(raw, list) or not raw or not all(isinstance(m, str) and m for m in raw):
        raise UserError(f"{where}: metric must name a key of the runs' manifest stats (e.g. val_loss), "
                        "or a list of them")
    names = [s.name for s in steps]
    out = []
    for m in raw:
        step, sep, key = m.rpartition(":")
        if sep and step not in names:
            raise UserError(f"{where}: metric {m!r} names step {step!r}; the steps are {', '.join(names)}")
        out.append((step if sep else names[-1], key))
    return out


def _check_settings(exp: Experiment, where: str) -> None:
    """Every variant's settings resolve in their stage's config, and no variant is the baseline."""
    seed = {"seed": exp.seeds[0]}
    seen = {}
    for variant in exp.names:
        runs = []
        for step in exp.steps:
            settings = exp.settings(variant, step)
            if "seed" in settings and has_seed(step.stage):
                raise UserError(f"{where}: {variant} sets seed; the experiment's `seeds` set it for each run")
            try:
                cfg = resolved(step.stage, {**settings, **(seed if has_seed(step.stage) else {})})
            except ConfigError as e:
                raise UserError(f"{where}: {variant} ({step.stage} settings): {e}") from None
            runs.append((cfg, exp.args(variant, step)))
        same = next((other for other, r in seen.items() if r == runs), None)
        if same is not None:
            raise UserError(f"{where}: variant {variant!r} resolves to the same settings and inputs as "
                            f"{same!r}: it would measure nothing; change a setting or drop it")
        seen[variant] = runs
