from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from llmkit.config import config_to_dict, dotted_keys, parse_overrides, resolve_config
from llmkit.errors import ConfigError


@dataclass
class Model:
    n_layers: int = 2
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"


@dataclass
class Cfg:
    lr: float = 1e-3
    steps: int = 10
    name: Optional[str] = None
    flags: list[str] = field(default_factory=lambda: ["a"])
    use_x: bool = False
    model: Model = field(default_factory=Model)


def test_precedence_defaults_recipe_set():
    cfg = resolve_config(Cfg, {"lr": 0.5, "steps": 3}, parse_overrides(["steps=7"]))
    assert (cfg.lr, cfg.steps) == (0.5, 7)


def test_dotted_keys_reach_nested_sections_and_keep_other_defaults():
    cfg = resolve_config(Cfg, {"model": {"norm": "layernorm"}},
                         parse_overrides(["model.n_layers=4"]))
    assert cfg.model == Model(n_layers=4, norm="layernorm")


def test_command_line_values_are_typed():
    cfg = resolve_config(Cfg, parse_overrides(["use_x=true", "flags=b,c", "name=none", "lr=2"]))
    assert cfg.use_x is True and cfg.flags == ["b", "c"] and cfg.name is None
    assert cfg.lr == 2.0 and isinstance(cfg.lr, float)


def test_unknown_key_names_the_closest_valid_one():
    with pytest.raises(ConfigError, match=r"unknown key 'stpes'.*did you mean 'steps'"):
        resolve_config(Cfg, parse_overrides(["stpes=3"]))
    with pytest.raises(ConfigError, match=r"'model.n_layer'.*did you mean 'model.n_layers'"):
        resolve_config(Cfg, parse_overrides(["model.n_layer=3"]))


def test_wrong_types_are_errors_naming_the_key():
    with pytest.raises(ConfigError, match="steps must be int"):
        resolve_config(Cfg, parse_overrides(["steps=many"]))
    with pytest.raises(ConfigError, match="steps must be int"):
        resolve_config(Cfg, {"steps": 1.5})
    with pytest.raises(ConfigError, match="model.norm must be one of"):
        resolve_config(Cfg, parse_overrides(["model.norm=batchnorm"]))
    with pytest.raises(ConfigError, match="--set expects key=value"):
        parse_overrides(["lr"])


def test_config_to_dict_round_trips():
    cfg = resolve_config(Cfg, {"model": {"n_layers": 3}})
    assert resolve_config(Cfg, config_to_dict(cfg)) == cfg


@dataclass
class Shingles:
    ngram: int = 5


@dataclass
class Sketch:
    threshold: float = 0.5
    shingles: Shingles = field(default_factory=Shingles)


@dataclass
class Dedup:
    method: str = "minhash"
    minhash: Sketch = field(default_factory=Sketch)
    simhash: Optional[Sketch] = None


def test_dotted_keys_list_sections_and_their_fields():
    assert dotted_keys(Sketch) == ["threshold", "shingles", "shingles.ngram"]
    assert "simhash.shingles.ngram" in dotted_keys(Dedup)  # through an optional section too


def test_a_nested_key_given_bare_or_misspelt_suggests_its_dotted_name():
    with pytest.raises(ConfigError, match=r"unknown key 'ngram'; did you mean 'minhash.shingles.ngram' or "
                                          r"'simhash.shingles.ngram'\?"):
        resolve_config(Dedup, parse_overrides(["ngram=3"]))
    with pytest.raises(ConfigError, match=r"'treshold'; did you mean 'minhash.threshold' or 'simhash.threshold'\?"):
        resolve_config(Dedup, parse_overrides(["treshold=0.8"]))
    with pytest.raises(ConfigError, match=r"'minhash_threshold'; did you mean 'minhash.threshold'\?"):
        resolve_config(Dedup, parse_overrides(["minhash_threshold=0.8"]))
    with pytest.raises(ConfigError, match=r"'minhash.treshold'; did you mean 'minhash.threshold'\?"):
        resolve_config(Dedup, parse_overrides(["minhash.treshold=0.8"]))


def test_two_pairs_in_one_set_value_are_refused():
    with pytest.raises(ConfigError, match="one pair per --set: --set method=exact --set minhash.threshold=0.9"):
        resolve_config(Dedup, parse_overrides(["method=exact minhash.threshold=0.9"]))
    with pytest.raises(ConfigError, match="--set model.n_layers=3 --set model.norm=layernorm"):
        resolve_config(Cfg, parse_overrides(["model.n_layers=3 model.norm=layernorm"]))
    # a value that merely holds `word=` is a value; so is the same text from a recipe
    assert resolve_config(Dedup, parse_overrides(["method=a b=c"])).method == "a b=c"
    assert resolve_config(Dedup, {"method": "x threshold=1"}).method == "x threshold=1"
