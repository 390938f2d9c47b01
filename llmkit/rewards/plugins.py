"""Reward functions as plugins: `--set reward=math,format,my_rewards.py:score` on `llmkit ppo`.

Each entry of the comma-separated `reward` is
- a built-in: `verify` (exact match with the row's `answer`, or partial credit), `format` (the
  completion matches `reward_format`, by default the reasoning-tags format), `math` and `code`
  (the verifiers beside this module, imported when named), or `model` (the reward model's score
  of prompt + response: `--reward RM`);
- `FILE.py:FUNCTION`: a function of a Python file, loaded by path (relative to where llmkit runs).

A reward function has TRL's signature, so a file written for TRL's GRPOTrainer runs unchanged:
`fn(prompts, completions, completion_ids, **columns) -> list[float | None]`, called once per
rollout with one entry per sampled response. As TRL does (GRPOTrainer._calculate_rewards):
- `prompts`: the row's `prompt` string, or for a chat row (`messages`) its turns up to the reply,
  a list of {role, content}; `completions`: the decoded reply — a string, or for a chat row
  `[{"role": "assistant", "content": reply}]`; `completion_ids`: the reply's token ids (its stop
  token included, as TRL's);
- `**columns`: every other column of the prompt dataset (`answer`, `id`, `tests`, …; not `messages`,
  a chat row's prompt), one value
  per response; `trainer_state` (`global_step`, `max_steps`), `log_metric(name, value)` (into
  metrics.jsonl) and `log_extra(column, values)` (accepted, not kept: llmkit has no completions
  table). Write `**kwargs` to take what you do not use.

A function may return None for a response it cannot judge: that reward is skipped (NaN) for
that response. A function that raises is called again response by response and scores None only
the responses it raises on (each counted in `reward_none/<name>`, the first few printed with the
file, line and row). Scores combine as TRL's: Σ weight × reward over the rewards that are not
None (`reward_weights`, default 1 each); a response no reward scored is unscorable (NaN: left out
of its group's baseline, advantage 0). A missing file or function, an unknown name, or a
function that returns the wrong number of rewards exits with code 2 naming it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import math
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from llmkit.errors import ConfigError, UserError
from llmkit.rewards.text import format_reward_of, verify_reward_of

MODES = ("auto", "model", "verify", "mix")  # one value: the reward of llmkit before plugins
# built-ins imported when named (their modules import what they need only then)
BUILTINS = {"math": "llmkit.rewards.math:math_reward", "code": "llmkit.rewards.code:code_reward",
            "format": "llmkit.rewards.text:format_reward", "verify": "llmkit.rewards.text:verify_reward"}
MODEL = "model"  # the reward model's score: a column the scorer fills from the model, not a function
SHOWN_FAILURES = 3  # failures printed per reward function; the rest are counted


def reward_names(requested: str, has_reward_model: bool) -> list[str]:
    """The rewards `requested` names: auto is the reward model if one is given, else verify; mix
    is model and verify; otherwise the comma-separated entries, each checked (not yet loaded)."""
    spec = requested.strip()
    if spec == "auto":
        names = [MODEL if has_reward_model else "verify"]
    elif spec == "mix":
        names = [MODEL, "verify"]
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ConfigError("reward is empty: name a reward (auto, model, verify, math, format, code, FILE.py:FUNCTION)")
    for name in names:
        if name != MODEL and name not in BUILTINS and not name.endswith(".py") and ".py:" not in name:
            choices = list(dict.fromkeys([*MODES, *BUILTINS]))
            close = difflib.get_close_matches(name, choices, n=1)
            raise ConfigError(f"reward: unknown reward {name!r}{f' (did you mean {close[0]}?)' if close else ''}; "
                              f"choose from {', '.join(choices)}, or FILE.py:FUNCTION")
        if name.endswith(".py"):
            raise ConfigError(f"reward: {name} names a file but no function; write {name}:FUNCTION")
    if MODEL in names and not has_reward_model:
        raise ConfigError(f"reward={spec} needs a reward model: pass --reward RM (a `llmkit rm` run), "
                          "or name rewards that need none (verify, math, format, code, FILE.py:FUNCTION)")
    if len(set(names)) < len(names):
        raise ConfigError(f"reward={spec} names a reward twice; give it a larger weight in reward_weights instead")
    return names


def reward_weights(names: list[str], requested: str, weights: list[float] | None,
                   verify_weight: float) -> list[float]:
    """One weight per reward: `weights` (reward_weights), or mix's 1 and verify_weight, or 1 each."""
    if weights is None:
        return [1.0, verify_weight] if requested.strip() == "mix" else [1.0] * len(names)
    if requested.strip() in ("auto", "mix"):
        raise ConfigError(f"reward_weights weighs named rewards: name them (reward=model,verify), not reward={requested}")
    if len(weights) != len(names):
        raise ConfigError(f"reward_weights has {len(weights)} weights for {len(names)} rewards ({', '.join(names)})")
    return [float(w) for w in weights]


def user_files(names: list[str]) -> list[Path]:
    """The Python files the rewards name (inputs of the run: editing one makes it stale)."""
    files = []
    for name in names:
        if name != MODEL and name not in BUILTINS:
            path = Path(name.rsplit(":", 1)[0])
            if not path.is_file():
                raise UserError(f"reward {name}: no file {path} (from {Path.cwd()}); give the path of a Python file")
            files.append(path)
    return list(dict.fromkeys(files))  # a file named for two of its functions is one input


@dataclass
class RewardSetup:
    """The rewards of a run, from its `reward`, `reward_weights` and `verify_weight` settings."""
    names: list[str]
    weights: list[float]
    shown: str  # in the stats: the mode (auto resolved) or the names

    @property
    def needs_model(self) -> bool:
        return MODEL in self.names

    @property
    def needs_answer(self) -> bool:  # the verifiable reward refuses a prompt without an answer
        return "verify" in self.names

    @property
    def files(self) -> list[Path]:
        return user_files(self.names)


def reward_setup(cfg, has_reward_model: bool) -> RewardSetup:
    """The rewards `cfg` (a PpoConfig) names, checked against the reward model given or not."""
    names = reward_names(cfg.reward, has_reward_model)
    spec = cfg.reward.strip()
    shown = ("model" if has_reward_model else "verify") if spec == "auto" else spec
    return RewardSetup(names, reward_weights(names, cfg.reward, cfg.reward_weights, cfg.verify_weight), shown)


# ---- loading ------------------------------------------------------------------------------------

@dataclass
class RewardFunction:
    name: str  # as the reward setting names it
    label: str  # in the metrics: the built-in's name, or FILE:FUNCTION without the folder and .py
    fn: Callable | None  # None: the reward model's score


def load_reward_functions(names: list[str], *, format_pattern: str | None = None,
                          partial_credit: bool = False) -> list[RewardFunction]:
    """A RewardFunction per name: built-ins imported, user files executed (once per name)."""
    loaded = []
    for name in names:
        if name == MODEL:
            loaded.append(RewardFunction(name, MODEL, None))
        elif name == "format":
            loaded.append(RewardFunction(name, name, format_reward_of(format_pattern)))
        elif name == "verify":
            loaded.append(RewardFunction(name, name, verify_reward_of(partial_credit)))
        elif name in BUILTINS:
            loaded.append(RewardFunction(name, name, builtin(name)))
        else:
            file, function = name.rsplit(":", 1)
            loaded.append(RewardFunction(name, f"{Path(file).stem}:{function}", function_of_file(Path(file), function)))
    return loaded


def builtin(name: str) -> Callable:
    module, function = BUILTINS[name].split(":")
    try:
        return getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as e:
        raise UserError(f"reward {name}: this llmkit lacks {BUILTINS[name]} ({e})") from None


def function_of_file(path: Path, function: str, kind: str = "reward") -> Callable:
    """`function` of the Python file at `path`, the file executed as a module of its own; `kind`
    (a reward, a tool) names what the user gave in the errors."""
    if not path.is_file():
        raise UserError(f"{kind} {path}:{function}: no file {path} (from {Path.cwd()})")
    module_name = f"llmkit_{kind}_file_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))  # the file may import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - anything a user's file raises is theirs to fix
        raise UserError(f"{kind} file {path} fails to load ({where_in(e, path)}{type(e).__name__}: {e})") from None
    finally:
        sys.path.remove(str(path.resolve().parent))
    fn = getattr(module, function, None)
    if not callable(fn):
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == module_name)
        raise UserError(f"{kind} file {path} has no function {function!r}"
                        f"{' (it defines ' + ', '.join(defined) + ')' if defined else ''}")
    return fn


def where_in(error: BaseException, path: Path) -> str:
    """'line N: ' of the deepest frame of `error` in the file at `path`, or ''."""
    if isinstance(error, SyntaxError) and error.lineno:
        return f"line {error.lineno}: "
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__)
             if Path(f.filename).resolve() == path.resolve()]
    return f"line {lines[-1]}: " if lines else ""


# ---- calling them -------------------------------------------------------------------------------

@dataclass
class RewardCall:
    """What a reward function is called with for one rollout (one entry per response)."""
    prompts: list
    completions: list
    completion_ids: list[list[int]]
    columns: dict[str, list]  # every other column of the rows
    trainer_state: object = None
    log_metric: Callable = lambda name, value: None

    def __len__(self) -> int:
        return len(self.completions)

    def kwargs(self, rows: slice | None = None) -> dict:
        rows = rows or slice(None)
        return {"prompts": self.prompts[rows], "completions": self.completions[rows],
                "completion_ids": self.completion_ids[rows],
                **{k: v[rows] for k, v in self.columns.items()},
                "trainer_state": self.trainer_state, "log_metric": self.log_metric,
                "log_extra": lambda column, values: None}


def call_reward(reward: RewardFunction, call: RewardCall, failures: list[str]) -> list[float]:
    """The reward of each response (NaN where the function gave None or raised; each raise
    noted in `failures`, 'row …: line N: Error: message')."""
    try:
        values = reward.fn(**call.kwargs())
    except Exception:  # noqa: BLE001 - one bad response must not end the run: find which
        values = []
        for i in range(len(call)):
            try:
                values += checked(reward, reward.fn(**call.kwargs(slice(i, i + 1))), 1)
            except UserError:
                raise
            except Exception as e:  # noqa: BLE001
                values.append(None)
                failures.append(f"row {row_name(call, i)}: {where_of(e, reward)}{type(e).__name__}: {e}")
    values = checked(reward, values, len(call))
    return [math.nan if v is None else v for v in values]


def checked(reward: RewardFunction, values, n: int) -> list[float | None]:
    """`values` as floats and Nones (NaN counts as None), or a UserError naming the function."""
    try:
        values = list(values)
    except TypeError:
        raise UserError(f"reward {reward.name} returned {type(values).__name__}, not a list of "
                        f"{n} numbers (None to skip one)") from None
    if len(values) != n:
        raise UserError(f"reward {reward.name} returned {len(values)} rewards for {n} completions; "
                        "return one per completion (None to skip one)")
    out = []
    for v in values:
        if v is not None and not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
            raise UserError(f"reward {reward.name} returned {v!r}; a reward is a number or None")
        out.append(None if v is None or math.isnan(float(v)) else float(v))
    return out


def row_name(call: RewardCall, i: int) -> str:
    ids = call.columns.get("id")
    return repr(ids[i]) if ids is not None and ids[i] is not None else f"#{i} of the rollout"


def where_of(error: BaseException, reward: RewardFunction) -> str:
    """'FILE.py line N: ' where a user file's function raised, or ''."""
    if ":" in reward.name and reward.name not in BUILTINS:
        file = Path(reward.name.rsplit(":", 1)[0])
        line = where_in(error, file)
        return f"{file} {line}" if line else f"{file}: "
    return ""


def score_rewards(rewards: list[RewardFunction], call: RewardCall,
                  model_scores: list[float] | None = None) -> tuple[list[list[float]], dict]:
    """(rewards [function][response] with NaN for None, metrics: each reward's mean over the
    responses it scored and its count of None) — the reward model's column from `model_scores`."""
    columns, metrics = [], {}
    for reward in rewards:
        failures: list[str] = []
        values = list(model_scores) if reward.fn is None else call_reward(reward, call, failures)
        for line in failures[:SHOWN_FAILURES]:
            print(f"warning: reward {reward.name} raised on {line}; that response scores None", file=sys.stderr)
        if len(failures) > SHOWN_FAILURES:
            print(f"warning: reward {reward.name} raised on {len(failures) - SHOWN_FAILURES} more responses",
                  file=sys.stderr)
        scored = [v for v in values if not math.isnan(v)]
        metrics[f"reward/{reward.label}"] = sum(scored) / len(scored) if scored else math.nan
        metrics[f"reward_none/{reward.label}"] = float(len(values) - len(scored))
        columns.append(values)
    return columns, metrics


def combine(columns: list[list[float]], weights: list[float]) -> list[float]:
    """Σ weight × reward over each response's rewards that are not NaN (TRL's nansum), NaN
    where none is."""
    totals = []
    for values in zip(*columns):
        known = [(w, v) for w, v in zip(weights, values) if not math.isnan(v)]
        totals.append(sum(w * v for w, v in known) if known else math.nan)
    return totals


def trainer_state(global_step: int, max_steps: int | None) -> SimpleNamespace:
    """What a reward function reads of TRL's TrainerState: the optimizer step and the run's steps."""
    return SimpleNamespace(global_step=global_step, max_steps=max_steps)


# ---- the scorer of a rollout (llmkit.train.ppo) -------------------------------------------------

def reward_call(samples, state=None, log_metric: Callable = lambda name, value: None) -> RewardCall:
    """What the reward functions are given for sampled responses (`train.rollouts.Samples`):
    each prompt as TRL gives it, the replies, their token ids and the rows' other columns."""
    n = len(samples.texts)
    prompts = samples.prompts or [None] * n
    rows = [(p.row if p is not None else None) or {} for p in prompts]
    chat = [isinstance(p.reward_prompt, list) if p is not None else False for p in prompts]
    # as TRL: every column but the prompt (`messages` is a chat row's prompt) and the completion
    keys = [k for k in dict.fromkeys(k for row in rows for k in row)
            if k not in ("prompt", "messages", "completion", "completion_ids")]
    columns = {k: [row.get(k) for row in rows] for k in keys}
    if "answer" not in columns:
        columns["answer"] = list(samples.answers)
    ids = [r[m.bool()].tolist() for r, m in zip(samples.responses, samples.response_mask)]
    return RewardCall(
        prompts=[p.reward_prompt if p is not None else None for p in prompts],
        completions=[[{"role": "assistant", "content": t}] if c else t for t, c in zip(samples.texts, chat)],
        completion_ids=ids, columns=columns, trainer_state=state, log_metric=log_metric)


class RewardScorer:
    """The score of each sampled response under `rewards` weighed by `weights` (`combine`): a
    tensor [N], NaN where no reward scored it. After each call `metrics` holds each reward's mean
    and count of None, the unscorable responses and what the functions logged; `state` is what
    they are given as `trainer_state` (set by the task before each rollout)."""

    def __init__(self, rewards: list[RewardFunction], weights: list[float], reward_model=None):
        if len(weights) != len(rewards):
            raise ValueError(f"{len(weights)} weights for {len(rewards)} rewards")
        self.rewards, self.weights, self.reward_model = rewards, weights, reward_model
        self.state, self.metrics = trainer_state(0, None), {}

    def __call__(self, samples):
        import torch

        logged = {}
        call = reward_call(samples, self.state, lambda name, value: logged.__setitem__(name, float(value)))
        model_scores = None
        if any(r.fn is None for r in self.rewards):
            # the reward model's score of prompt + response, read at the response's last token
            model = self.reward_model.to(samples.input_ids.device)
            model_scores = model(samples.input_ids, samples.attention_mask).float().tolist()
        columns, metrics = score_rewards(self.rewards, call, model_scores)
        totals = combine(columns, self.weights)
        metrics["reward_unscorable"] = float(sum(math.isnan(t) for t in totals))
        self.metrics = {**metrics, **logged}
        return torch.tensor(totals, dtype=torch.float32)
