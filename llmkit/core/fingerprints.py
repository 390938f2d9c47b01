"""An artifact's fingerprint: the llmkit version, the stage, its resolved config and its inputs'
fingerprints, hashed. Equal fingerprints mean a rerun has nothing to do.

A setting a later llmkit adds changes every config it appears in, so the plain hash would call
every artifact built before it stale (a pretraining run's model section gained `shared_expert_size`
in the house move: a demo workspace then rebuilt its scorer and, downstream of it, refused to
continue its pretraining). `recorded_fingerprint` is the hash of the config as the artifact's llmkit
spelled it: the keys its manifest's config lacks are left out while they hold their default, which
does what the earlier llmkit did. A changed default still changes the hash (the key was recorded).
The training runs' own record applies the same rule (llmkit.train.checkpoint.plan_run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from llmkit.core.config import config_to_dict
from llmkit.version import __version__


def fingerprint_of(stage: str, config: dict, input_fingerprints: list[str]) -> str:
    blob = json.dumps(
        {"llmkit": __version__, "stage": stage, "config": config, "inputs": input_fingerprints},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def config_defaults(config) -> dict:
    """Each field's default, nested sections as dicts (what `config_to_dict` gives a fresh config);
    {} for a config that is not a dataclass."""
    if not dataclasses.is_dataclass(config):
        return {}
    out = {}
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            out[f.name] = config_to_dict(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = config_to_dict(f.default_factory())
    return out


def without_later_defaults(config: dict, recorded: dict, defaults: dict) -> dict:
    """`config` less the keys `recorded` lacks that hold their default in `defaults`, at any depth."""
    out = {}
    for key, value in config.items():
        if key not in recorded:
            if key in defaults and value == defaults[key]:
                continue
        elif isinstance(value, dict) and isinstance(recorded[key], dict) and isinstance(defaults.get(key), dict):
            value = without_later_defaults(value, recorded[key], defaults[key])
        out[key] = value
    return out


def recorded_fingerprint(stage: str, config, input_fingerprints: list[str], recorded: dict,
                         defaults: dict | None = None) -> str:
    """The fingerprint of `config` spelled as `recorded` (an artifact's manifest config) spells it;
    `defaults` for a config given as a dict."""
    defaults = config_defaults(config) if defaults is None else defaults
    spelled = without_later_defaults(config_to_dict(config, fingerprint=True), recorded, defaults)
    return fingerprint_of(stage, spelled, input_fingerprints)
