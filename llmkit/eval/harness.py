"""`llmkit eval --tasks NAME,…`: lm-evaluation-harness tasks on an llmkit model, offline.

Tasks are found, in this order, in `harness.include_path` (a folder of lm-eval task YAMLs), in
llmkit's own folder (`llmkit/eval/harness_tasks/`: MMLU, CMMLU and C-Eval from local files in
their published layouts, and two 200-question files) and in lm-eval's own tasks (indexing those
takes ~10 s, so they are read only when a name is not found before). Datasets load with the
network shut (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1): a task reads local files (`dataset_path:
json|csv|parquet` + `data_files`, or a datasets cache); one that names a hub dataset is refused.
`harness.data.<task>=FILE` (and `harness.fewshot_data.<task>=FILE`, its few-shot split) points a
task at files: a file's suffix picks the reader; a relative `data_files` path in a YAML of
llmkit's folder is relative to that folder.

lm-eval's results are kept as it reports them: `results[task]["acc,none"]`,
`["acc_stderr,none"]`, … plus the groups' aggregates, the shots and sample counts per task, and
`scored_files[task]`: the files of the split each task is scored on, which
llmkit.eval.provenance checks against the decontamination inputs of the run's training data.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from llmkit.errors import ConfigError, UserError

SHIPPED = Path(__file__).parent / "harness_tasks"
READERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
LOCAL_BUILDERS = set(READERS.values()) | {"arrow"}
KEPT = ("results", "groups", "group_subtasks", "n-shot", "n-samples", "versions", "higher_is_better")


@dataclass
class HarnessConfig:
    tasks: list[str] = field(default_factory=list)  # lm-eval task / group names (`--tasks` puts them here)
    include_path: str | None = None  # a folder of lm-eval task YAMLs, searched first
    data: dict[str, str] = field(default_factory=dict)  # task -> the file its evaluated split reads
    fewshot_data: dict[str, str] = field(default_factory=dict)  # task -> the file of its few-shot split
    num_fewshot: int | None = None   # solved examples before each question (None: each task's own)
    limit: float | None = None       # at most this many documents per task (< 1: a fraction)
    chat_template: bool = False      # render prompts through the model's chat template
    fewshot_as_multiturn: bool = False  # with chat_template: each example a user/assistant turn
    max_gen_toks: int = 256          # generate_until's default token limit (a task may set its own)
    prompt_start: Literal["transformers", "document"] = "transformers"  # what a text starts with:
    #   transformers' tokenizer(text) (comparable with lm-eval's hf backend), or llmkit's </s>
    #   (`Tokenizer.document_start_ids()`, what llmkit's choice metric reads)
    generation_batch_size: int = 16  # prompts generated together
    bootstrap_iters: int = 1000      # resamples for the stderr of non-mean metrics (lm-eval CLI: 100000)
    seed: int = 0                    # lm-eval's random, numpy, torch and few-shot seeds

    def __post_init__(self):
        if self.num_fewshot is not None and self.num_fewshot < 0:
            raise ConfigError(f"harness.num_fewshot must be ≥ 0, got {self.num_fewshot}")
        if self.limit is not None and self.limit <= 0:
            raise ConfigError(f"harness.limit must be > 0, got {self.limit}")
        if self.fewshot_as_multiturn and not self.chat_template:
            raise ConfigError("harness.fewshot_as_multiturn needs harness.chat_template=true")


def harness_files(cfg: HarnessConfig) -> list[str]:
    """The files a run reads besides lm-eval itself (inputs of the eval artifact): the named data
    files and the include_path's task YAMLs."""
    yamls = sorted(str(p) for p in Path(cfg.include_path).rglob("*.yaml")) if cfg.include_path and \
        Path(cfg.include_path).is_dir() else []
    return [*cfg.data.values(), *cfg.fewshot_data.values(), *yamls]


def shut_the_network() -> None:
    """Offline mode for datasets and the hub, also when they were imported before."""
    import sys

    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    if "datasets" in sys.modules:
        sys.modules["datasets"].config.HF_DATASETS_OFFLINE = True
        sys.modules["datasets"].config.HF_HUB_OFFLINE = True
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = True


# -- finding tasks ---------------------------------------------------------------------------

def task_manager(cfg: HarnessConfig):
    """A TaskManager that knows every name in cfg.tasks (lm-eval's own tasks only when needed)."""
    paths = [SHIPPED]
    if cfg.include_path:
        folder = Path(cfg.include_path)
        if not folder.is_dir():
            raise UserError(f"harness.include_path={cfg.include_path}: no such folder; give a folder of "
                            "lm-eval task YAMLs")
        paths.append(folder)
    named = [*cfg.tasks, *cfg.data, *cfg.fewshot_data]
    manager = _manager_class()(include_path=paths, include_defaults=False, cfg=cfg)
    if not all(n in manager.all_tasks for n in named):
        manager = _manager_class()(include_path=paths, include_defaults=True, cfg=cfg)
    for name in cfg.tasks:
        if name not in manager.all_tasks:
            raise UserError(f"--tasks: unknown task {name!r}{_closest(name, manager.all_tasks, 3)}")
    for key in {**cfg.data, **cfg.fewshot_data}:
        if key not in manager.all_tasks:
            raise UserError(f"harness.data / harness.fewshot_data: no task {key!r}{_closest(key, manager.all_tasks, 1)}")
    return manager


def _closest(name: str, names: list[str], n: int) -> str:
    close = difflib.get_close_matches(name, names, n=n, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else \
        " (none of lm-eval's, llmkit's or harness.include_path's tasks has that name)"


def _manager_class():
    """TaskManager that points tasks at `harness.data` files and keeps what it built, so the
    tasks checked before a run are the ones evaluated."""
    from lm_eval.tasks import TaskManager

    class LocalTasks(TaskManager):
        def __init__(self, *, cfg: HarnessConfig, **kwargs):
            super().__init__(**kwargs)
            self.cfg, self.built = cfg, {}

        def _load_spec(self, spec):
            if not isinstance(spec, str):
                return super()._load_spec(spec)
            if spec not in self.built:
                entry = self._entry(spec)
                overrides = data_overrides(spec, entry, self.cfg) if entry is not None else None
                self.built[spec] = (self._factory.build(entry, overrides=overrides, registry=self._index)
                                    if overrides else super()._load_spec(spec))
            return self.built[spec]

    return LocalTasks


def data_overrides(name: str, entry, cfg: HarnessConfig) -> dict | None:
    """The config keys that point task `name` at its files: `harness.data` / `fewshot_data`, or
    the relative `data_files` of a task shipped with llmkit made absolute."""
    base = dict(entry.cfg or {})
    shipped = entry.yaml_path is not None and Path(entry.yaml_path).parent == SHIPPED
    if name not in cfg.data and name not in cfg.fewshot_data and not shipped:
        return None
    split = base.get("test_split") or base.get("validation_split") or "test"
    files = dict((base.get("dataset_kwargs") or {}).get("data_files") or {})
    if shipped:
        files = {k: str(SHIPPED / v) for k, v in files.items()}
    if name in cfg.data:
        files[split] = cfg.data[name]
    fewshot = base.get("fewshot_split")
    if name in cfg.fewshot_data:
        files[fewshot or "dev"] = cfg.fewshot_data[name]
        fewshot = fewshot or "dev"
    if split not in files:
        layout = (base.get("metadata") or {}).get("layout", "")
        raise UserError(f"task {name} reads a file you name: --set harness.data.{name}=FILE"
                        + (f" ({layout})" if layout else ""))
    for path in files.values():
        if not Path(path).is_file():
            raise UserError(f"task {name}: data file {path} does not exist")
    readers = {READERS.get(_suffix(p)) for p in files.values()}
    if None in readers or len(readers) > 1:
        raise UserError(f"task {name}: data files must all be one of {', '.join(READERS)}, got "
                        f"{', '.join(map(str, files.values()))}")
    reader = readers.pop()
    out = {"dataset_path": reader, "dataset_name": None, "custom_dataset": load_split_files,
           "dataset_kwargs": {**(base.get("dataset_kwargs") or {}), "data_files": files, "reader": reader}}
    if fewshot and fewshot not in files:
        out["fewshot_split"] = None  # asked for shots, it is refused in check_fewshot
    if shipped and base.get("fewshot_config"):
        from llmkit.eval.harness_lm import SubjectFirstN

        out["fewshot_config"] = {**base["fewshot_config"], "sampler": SubjectFirstN}
    return out


def load_split_files(data_files: dict, reader: str, **_) -> object:
    """A DatasetDict of one split per file, each read on its own: a split's columns need not be
    another's (C-Eval's dev files have an `explanation` its val files lack)."""
    import datasets

    return datasets.DatasetDict({split: datasets.load_dataset(reader, data_files={split: path}, split=split)
                                 for split, path in data_files.items()})


def _suffix(path: str) -> str:
    name = Path(path).name.removesuffix(".gz")
    return Path(name).suffix


# -- checking tasks before the run ----------------------------------------------------------

def build_tasks(manager, cfg: HarnessConfig) -> list:
    """Every leaf task of cfg.tasks, built (data loaded) and checked; a UserError names the task
    that needs the network, a missing file or a missing column."""
    leaves = []
    for name in cfg.tasks:
        refuse_hub_dataset(manager, name)
        try:
            loaded = manager.load([name])
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 — datasets and lm-eval raise many kinds; the message says which
            raise UserError(f"task {name}: its data does not load offline ({type(e).__name__}: "
                            f"{_first_line(e)}); point it at local files with --set "
                            f"harness.data.{name}=FILE") from None
        leaves += list(loaded["tasks"].values())
    for task in leaves:
        check_fewshot(task, cfg)
        check_columns(task)
    return leaves


def refuse_hub_dataset(manager, name: str) -> None:
    """A task (not a group) whose YAML names a hub dataset that is not in the datasets cache."""
    entry = manager.task_index.get(name)
    if entry is None or entry.kind.name not in ("TASK", "PY_TASK") or name in manager.cfg.data:
        return
    path = (entry.cfg or {}).get("dataset_path")
    if path and path not in LOCAL_BUILDERS and not Path(path).exists() and not _in_datasets_cache(path):
        raise UserError(f"task {name} reads the hub dataset {path!r}, which needs the network (evaluation "
                        f"runs offline): point it at local files with --set harness.data.{name}=FILE, or "
                        "use llmkit's mmlu_local / cmmlu_local / ceval_local with the published files")


def _in_datasets_cache(path: str) -> bool:
    from datasets import config

    return any(Path(config.HF_DATASETS_CACHE).glob(path.replace("/", "___") + "*"))


def check_fewshot(task, cfg: HarnessConfig) -> None:
    """A task of llmkit's folder asked for shots has its few-shot file (lm-eval would take them
    from the evaluated split)."""
    shots = cfg.num_fewshot if cfg.num_fewshot is not None else (task.config.num_fewshot or 0)
    if shots and task.config.fewshot_split is None and (task.config.metadata or {}).get("layout"):
        raise UserError(f"task {task.config.task}: {shots} shots need its few-shot file: --set "
                        f"harness.fewshot_data.{task.config.task}=FILE (the dev split)")


def check_columns(task) -> None:
    """Every field the task's prompt, target and choices name is a column of each split it reads
    (a UserError names the file and the column), and its first document renders."""
    import jinja2

    for split, docs in _splits(task):
        if len(docs) == 0:
            raise UserError(f"task {task.config.task}: its {split} split is empty ({_files_of(task, split)})")
        columns = list(docs.column_names) if hasattr(docs, "column_names") else list(docs[0])
        missing = sorted(template_fields(task) - set(columns))
        try:
            if not missing:
                task.doc_to_text(docs[0]), task.doc_to_target(docs[0])
                if task.OUTPUT_TYPE == "multiple_choice":
                    task.doc_to_choice(docs[0])
        except (jinja2.exceptions.UndefinedError, KeyError) as e:
            missing = [next((a or b for a, b in re.findall(r"'([^']+)' is undefined|'([^']+)'", str(e))), str(e))]
        if missing:
            raise UserError(f"task {task.config.task}: {_files_of(task, split)} has no column {missing[0]!r} "
                            f"(its columns: {', '.join(columns)}); the task's prompt reads it" + _layout(task))


def template_fields(task) -> set[str]:
    """The document fields doc_to_text, doc_to_target and doc_to_choice read: a bare field name,
    or the variables of a jinja template."""
    import jinja2
    from jinja2 import meta

    fields: set[str] = set()
    for template in (task.config.doc_to_text, task.config.doc_to_target, task.config.doc_to_choice):
        if not isinstance(template, str):
            continue
        if re.fullmatch(r"\w+", template):
            fields.add(template)
        else:
            fields |= meta.find_undeclared_variables(jinja2.Environment().parse(template))
    return fields


def _splits(task) -> list[tuple[str, object]]:
    config = task.config
    names = [s for s in (config.test_split, config.validation_split, config.fewshot_split) if s]
    return [(s, task.dataset[s]) for s in dict.fromkeys(names) if task.dataset is not None and s in task.dataset]


def _files_of(task, split: str) -> str:
    files = (task.config.dataset_kwargs or {}).get("data_files") or {}
    return str(files.get(split, f"{task.config.dataset_path} [{split}]"))


def _layout(task) -> str:
    layout = (task.config.metadata or {}).get("layout")
    return f" — the layout: {layout}" if layout else ""


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


# -- running ---------------------------------------------------------------------------------

def run_harness(lm, cfg: HarnessConfig) -> dict | None:
    """lm-eval's results of cfg.tasks on `lm` (an lm-eval LM), the network shut. Under several
    ranks (torch.distributed initialised) each scores its share of the documents and rank 0
    returns the gathered results; the other ranks return None."""
    shut_the_network()
    import logging

    from lm_eval import evaluator

    import datasets

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    logging.getLogger("lm_eval.api.task").setLevel(logging.ERROR)  # says custom_dataset takes --metadata
    datasets.disable_progress_bars()
    manager = task_manager(cfg)
    leaves = build_tasks(manager, cfg)
    out = evaluator.simple_evaluate(
        model=lm, tasks=list(cfg.tasks), task_manager=manager, num_fewshot=cfg.num_fewshot,
        limit=cfg.limit, bootstrap_iters=cfg.bootstrap_iters, log_samples=False,
        apply_chat_template=cfg.chat_template, fewshot_as_multiturn=cfg.fewshot_as_multiturn,
        random_seed=cfg.seed, numpy_random_seed=cfg.seed, torch_random_seed=cfg.seed,
        fewshot_random_seed=cfg.seed)
    if out is None:
        return None
    return {**{k: out[k] for k in KEPT if k in out}, "scored_files": scored_files(leaves)}


def scored_files(tasks: list) -> dict[str, list[str] | None]:
    """Each leaf task's files of the split it is scored on (lm-eval's: test when the task has one,
    else validation), absolute; None where its data is not local files (a cache, a folder)."""
    out = {}
    for task in tasks:
        config = task.config
        split = config.test_split if task.has_test_docs() else config.validation_split
        files = (config.dataset_kwargs or {}).get("data_files") or {}
        chosen = files.get(split) if isinstance(files, dict) else files
        paths = [chosen] if isinstance(chosen, str) else list(chosen or [])
        out[config.task] = ([str(Path(p).resolve()) for p in paths]
                            if paths and all(Path(p).is_file() for p in paths) else None)
    return out


def headline(harness: dict) -> dict:
    """`harness/<task>/<metric>` for each number lm-eval reports (stderr beside its metric)."""
    flat = {}
    for task, metrics in harness.get("results", {}).items():
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and "," in key:
                flat[f"harness/{task}/{key.split(',')[0]}"] = value
    return flat
