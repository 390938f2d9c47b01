"""The table of llmkit's commands, in pipeline order: the one place that names them.

Each stage's command, its CLI function, its config class, its kind and the artifact names it
writes without `--out`. The CLI builds its commands from it (and each stage's `--help` from the
config's source), the recipe checker reads a section against it, the workspace and `llmkit
status` say from it which command builds a missing artifact and in which order. Only names live
here: a module is imported when a caller asks for it (`config_class`, the CLI's `build_app`, a
command's `deferred` library function), so reading the table costs nothing and `llmkit --help`
stays free of torch.

A stage's recipe section is its command name; a section for one artifact of a stage (the demo's
`scorer:`, a second pretrain run) names its stage instead (`stage: pretrain`, llmkit.core.recipes).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

KINDS = ("data", "training", "model", "report", "workspace", "helper")


@dataclass(frozen=True)
class Stage:
    command: str  # `llmkit <command>`, and its recipe section
    cli: str  # "module:function" of the command (llmkit.cli)
    config: str | None  # "module:Class" of its config dataclass; None: the command has no settings
    kind: str  # data | training (a checkpoint run) | model (reads one) | report | workspace | helper
    # artifact name -> the options that build it under that name, the stage's default first
    outputs: dict[str, str] = field(default_factory=dict)
    folder: str = ""  # the workspace folder its artifacts go in ("eval/": `--out X` is eval/X)

    @property
    def section(self) -> str:
        return self.command

    @property
    def default_output(self) -> str | None:
        return next(iter(self.outputs), None)


STAGES = (
    Stage("ingest", "llmkit.cli.ingest:ingest", "llmkit.data.ingest:IngestConfig", "data",
          {"raw": "", "sft_train": "--kind sft --out sft_train",
           "pref_train": "--kind preference --out pref_train",
           "prompts_train": "--kind prompt --out prompts_train",
           "feedback_train": "--kind feedback --out feedback_train"}),
    Stage("clean", "llmkit.cli.clean:clean", "llmkit.data.clean:CleanConfig", "data",
          {"clean": ""}),
    Stage("dedup", "llmkit.cli.dedup:dedup", "llmkit.data.dedup.stage:DedupConfig", "data",
          {"dedup": ""}),
    Stage("ppl-filter", "llmkit.cli.ppl_filter:ppl_filter", "llmkit.data.ppl_filter:PplFilterConfig",
          "data", {"filtered": ""}),
    Stage("decontaminate", "llmkit.cli.decontaminate:decontaminate",
          "llmkit.data.decontam:DecontamConfig", "data", {"decontaminated": ""}),
    Stage("quality", "llmkit.cli.quality:quality", "llmkit.data.quality:QualityConfig", "data",
          {"quality": "", "quality_model": "--good GOOD --bad BAD --train-only"}),
    Stage("tokenizer", "llmkit.cli.tokenizer:tokenizer",
          "llmkit.data.tokenizer_training:TokenizerConfig", "data", {"tokenizer": ""}),
    Stage("tokenize", "llmkit.cli.tokenize:tokenize", "llmkit.data.tokenize:TokenizeConfig", "data",
          {"tokens": ""}),
    Stage("pretrain", "llmkit.cli.pretrain:pretrain", "llmkit.train.pretrain:PretrainConfig",
          "training", {"pretrain": ""}),
    Stage("sft", "llmkit.cli.sft:sft", "llmkit.train.sft:SftConfig", "training", {"sft": ""}),
    Stage("rm", "llmkit.cli.rm:rm", "llmkit.train.rm:RmConfig", "training", {"rm": ""}),
    Stage("dpo", "llmkit.cli.dpo:dpo", "llmkit.train.dpo:DpoConfig", "training", {"dpo": ""}),
    Stage("kto", "llmkit.cli.kto:kto", "llmkit.train.kto:KtoConfig", "training", {"kto": ""}),
    Stage("ppo", "llmkit.cli.ppo:ppo", "llmkit.train.ppo_config:PpoConfig", "training", {"ppo": ""}),
    Stage("distill", "llmkit.cli.distill:distill", "llmkit.train.distill:DistillConfig", "training",
          {"distill": ""}),
    Stage("eval", "llmkit.cli.eval:eval_", "llmkit.eval.stage:EvalConfig", "model", folder="eval/"),
    Stage("generate", "llmkit.cli.generate:generate", "llmkit.generation:GenerateConfig", "model"),
    Stage("judge", "llmkit.cli.judge:judge", "llmkit.judge.session:JudgeConfig", "model",
          {"judge": "--from RUN,RUN --prompts PROMPTS", "judge_prefs": "--export"}),
    Stage("synth", "llmkit.cli.synth:synth", "llmkit.synth.config:SynthConfig", "data",
          {f"synth_{kind}": f"--kind {kind}" for kind in
           ("instructions", "answers", "qa", "rephrase", "pairs")}),
    Stage("export", "llmkit.cli.export:export", "llmkit.hf.export:ExportConfig", "model",
          {"export/hf": ""}),
    Stage("import", "llmkit.cli.import_:import_", "llmkit.hf.import_:ImportConfig", "model",
          {"imported": ""}),
    Stage("extend-vocab", "llmkit.cli.extend_vocab:extend_vocab", "llmkit.hf.vocab_extend:ExtendVocabConfig",
          "model", {"extended": ""}),
    Stage("merge", "llmkit.cli.merge:merge", "llmkit.merge.stage:MergeConfig", "model", {"merged": ""}),
    Stage("ablate", "llmkit.cli.ablate:ablate", "llmkit.ablate.experiment:AblateConfig", "report",
          {"ablate": ""}),  # runs other stages: an experiment's variants × seeds, and their results
    Stage("report", "llmkit.cli.report:report", "llmkit.report:ReportConfig", "report"),
    Stage("status", "llmkit.cli.status:status", None, "workspace"),
    Stage("config", "llmkit.cli.config:config", None, "helper"),  # prints any stage's settings
)

BY_COMMAND = {s.command: s for s in STAGES}
CONFIGURED = [s.command for s in STAGES if s.config]  # the stages a recipe section can configure
TRAINING = tuple(s.command for s in STAGES if s.kind == "training")
OUTPUTS = [name for s in STAGES for name in s.outputs]  # the artifact names stages write by themselves


def config_class(command: str) -> type:
    """The config dataclass of a stage (imports its module)."""
    module, name = BY_COMMAND[command].config.split(":")
    return getattr(importlib.import_module(module), name)


def deferred(target: str):
    """The library function `"module:function"`, imported when it is first called.

    A command module names the library function it runs this way instead of importing it,
    because `llmkit --help` imports every command module (`build_app`) and a stage's library
    module loads numpy, pyarrow or torch: the import waits until the command runs. This is the
    one place a command's library function is resolved by name; its header still names it."""
    module, name = target.split(":")

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.target = target
    return call


def stage_of_function(target: str) -> Stage | None:
    """The stage whose CLI is `"module:function"`."""
    return next((s for s in STAGES if s.cli == target), None)


def built_by(artifact: str) -> tuple[Stage, str] | None:
    """(stage, its options) that write `artifact` under that name without being told, or with
    the options the name stands for (`sft_train`: `ingest --kind sft --out sft_train`)."""
    return next(((s, s.outputs[artifact]) for s in STAGES if artifact in s.outputs), None)


def build_command(artifact: str) -> str | None:
    """`clean`, `ingest --kind sft --out sft_train`: the command (after `llmkit`, before its
    input files) that builds `artifact`, or None when no stage writes that name by itself."""
    found = built_by(artifact)
    return None if found is None else " ".join(filter(None, (found[0].command, found[1])))


def pipeline_rank(command: str) -> int:
    """A stage's place in the pipeline; after every stage for a name that is none."""
    return list(BY_COMMAND).index(command) if command in BY_COMMAND else len(STAGES)
