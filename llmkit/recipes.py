"""Which config dataclass reads which recipe section, and a check of a whole recipe."""

from __future__ import annotations

import difflib
import importlib

from llmkit.config import resolve_config
from llmkit.errors import ConfigError

# recipe section -> "module:ConfigClass" (imported only when a recipe is checked)
STAGE_CONFIGS = {
    "ingest": "llmkit.data.ingest:IngestConfig",
    "clean": "llmkit.data.clean:CleanConfig",
    "dedup": "llmkit.data.dedup.stage:DedupConfig",
    "ppl-filter": "llmkit.data.ppl_filter:PplFilterConfig",
    "tokenizer": "llmkit.tokenizer_training:TokenizerConfig",
    "tokenize": "llmkit.data.tokenize:TokenizeConfig",
    "pretrain": "llmkit.train.pretrain:PretrainConfig",
    "sft": "llmkit.train.sft:SftConfig",
    "rm": "llmkit.train.rm:RmConfig",
    "dpo": "llmkit.train.dpo:DpoConfig",
    "ppo": "llmkit.train.ppo:PPOConfig",
    "eval": "llmkit.eval.stage:EvalConfig",
    "generate": "llmkit.api:GenerateConfig",
    "export": "llmkit.hf.export:ExportConfig",
    "import": "llmkit.hf.import_:ImportConfig",
    "report": "llmkit.report:ReportConfig",
}


def check_section_names(recipe: dict, path="recipe") -> None:
    for name in recipe:
        if name not in STAGE_CONFIGS:
            close = difflib.get_close_matches(str(name), list(STAGE_CONFIGS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{path}: unknown section {name!r}{hint}")


def config_class(section: str):
    module, cls = STAGE_CONFIGS[section].split(":")
    return getattr(importlib.import_module(module), cls)


def check_recipe(recipe: dict, path="recipe") -> dict:
    """Every section resolved against its stage's config, then the stages against each other:
    errors name the section and key."""
    check_section_names(recipe, path)
    resolved = {}
    for section, values in recipe.items():
        try:
            resolved[section] = resolve_config(config_class(section), values)
        except ConfigError as e:
            raise ConfigError(f"{path} [{section}]: {e}") from None
    problems = pipeline_problems(resolved)
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    return resolved


TRAINING = ("pretrain", "sft", "rm", "dpo", "ppo")


def pipeline_problems(resolved: dict) -> list[str]:
    """What would stop a later stage of the recipe's pipeline, found before the first one runs:
    every training stage starts from the model `pretrain` builds, so each one's sequences must
    fit its positions and the tokenizer's vocabulary its embedding."""
    if "pretrain" not in resolved:
        return []  # the model comes from elsewhere (--from an imported run): nothing to check here
    vocab = resolved["tokenizer"].vocab_size if "tokenizer" in resolved else None
    model = resolved["pretrain"].model.build(vocab or 32000)
    problems = [f"[{stage}] seq_len={resolved[stage].seq_len} exceeds the model's max_seq_len="
                f"{model.max_seq_len} (pretrain.model); lower {stage}.seq_len or raise "
                "pretrain.model.max_seq_len" for stage in TRAINING
                if stage in resolved and resolved[stage].seq_len > model.max_seq_len]
    if vocab and model.vocab_size < vocab:
        problems.append(f"[tokenizer] vocab_size={vocab} exceeds pretrain.model.vocab_size="
                        f"{model.vocab_size}; drop pretrain.model.vocab_size or raise it")
    return problems
