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
    "tokenizer": "llmkit.tokenizer:TokenizerConfig",
    "tokenize": "llmkit.data.tokenize:TokenizeConfig",
    "pretrain": "llmkit.train.pretrain:PretrainConfig",
    "sft": "llmkit.train.sft:SftConfig",
    "rm": "llmkit.train.rm:RmConfig",
    "dpo": "llmkit.train.dpo:DpoConfig",
    "ppo": "llmkit.train.ppo:PPOConfig",
    "eval": "llmkit.eval.stage:EvalConfig",
    "generate": "llmkit.api:GenerateConfig",
    "export": "llmkit.hf:ExportConfig",
    "import": "llmkit.hf:ImportConfig",
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
    """Every section resolved against its stage's config: errors name the section and key."""
    check_section_names(recipe, path)
    resolved = {}
    for section, values in recipe.items():
        try:
            resolved[section] = resolve_config(config_class(section), values)
        except ConfigError as e:
            raise ConfigError(f"{path} [{section}]: {e}") from None
    return resolved
