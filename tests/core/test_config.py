from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from llmkit.core.config import config_to_dict, dotted_keys, parse_overrides, resolve_config
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


# -- the keys of a config, read from its source (what --help lists) --------------------------------

@dataclass
class Documented(Cfg):
    steps: int = 20  # optimizer steps (the subclass's default and comment)
    window: int = 2**10  # tokens a window holds; this comment goes on
    #                      on a line of its own, aligned under it
    # --- a heading, not part of the comment above
    tags: list[str] = field(
        default_factory=lambda: list(STOP_WORDS))  # words to skip
    shingles: Optional[Shingles] = None  # an optional section: its keys are listed too


STOP_WORDS = ("the", "a")


def test_documented_keys_are_read_from_the_source_bases_first():
    from llmkit.core.keydocs import documented_keys

    docs = {d.key: d for d in documented_keys("tests.core.test_config:Documented")}
    assert list(docs) == dotted_keys(Documented)  # base fields first; `steps` keeps its place
    assert (docs["steps"].default, docs["steps"].comment) == ("20", "optimizer steps (the subclass's default and comment)")
    assert docs["window"].default == "1024"
    assert docs["window"].comment == "tokens a window holds; this comment goes on on a line of its own, aligned under it"
    assert (docs["tags"].type, docs["tags"].default, docs["tags"].comment) == ("list[str]", "[the, a]", "words to skip")
    assert docs["name"].type == "Optional[str]" and docs["name"].default == "null"
    assert docs["model"].section and docs["model.norm"].default == "rmsnorm"
    assert docs["shingles"].section and docs["shingles.ngram"].default == "5"


def test_documented_keys_of_every_stage_match_its_config_class():
    """The source reading (what `--help` shows without importing torch) equals the imported
    dataclasses: the same keys in the same order, and every constant default equal."""
    import dataclasses

    from llmkit.core.config import yaml_value
    from llmkit.core.keydocs import documented_keys
    from llmkit.stages import CONFIGURED, BY_COMMAND, config_class

    for section in CONFIGURED:
        cls = config_class(section)
        docs = documented_keys(BY_COMMAND[section].config)
        assert [d.key for d in docs] == dotted_keys(cls), section
        for doc in docs:
            *parents, leaf = doc.key.split(".")
            owner = cls
            for p in parents:
                owner = _section_type(owner, p)
            f = next(f for f in dataclasses.fields(owner) if f.name == leaf)
            declared = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if not doc.section and not doc.default.endswith(")"):
                assert doc.default == yaml_value(declared), (section, doc.key)


def _section_type(cls, name):
    import typing

    from llmkit.core.config import _dataclass_in

    return _dataclass_in(typing.get_type_hints(cls)[name])


def test_printed_config_resolves_back_to_the_same_config_for_every_stage():
    """`llmkit config`'s YAML (values marked with their source), read back as a recipe section,
    resolves to the config it printed."""
    import yaml

    from llmkit.core.config import config_yaml, value_sources
    from llmkit.stages import CONFIGURED, config_class

    for section in CONFIGURED:
        cls = config_class(section)
        cfg = resolve_config(cls)
        printed = config_yaml(cfg, section, value_sources(cls, {}))
        assert resolve_config(cls, yaml.safe_load(printed)[section]) == cfg, section


def test_value_sources_name_the_last_layer_that_set_each_key():
    from llmkit.core.config import config_yaml, value_sources

    recipe = {"lr": 0.5, "steps": 3, "model": {"norm": "layernorm"}}
    overrides = parse_overrides(["steps=7", "model.n_layers=4"])
    sources = value_sources(Cfg, {"recipe": recipe, "set": overrides})
    assert sources == {"lr": "recipe", "steps": "set", "model.norm": "recipe", "model.n_layers": "set"}
    text = config_yaml(resolve_config(Cfg, recipe, overrides), "stage", sources)
    assert text.splitlines() == [
        "stage:", "  lr: 0.5  # recipe", "  steps: 7  # set", "  name: null  # default",
        "  flags: [a]  # default", "  use_x: false  # default", "  model:",
        "    n_layers: 4  # set", "    norm: layernorm  # recipe"]


# -- warmup left at its default never makes a short run invalid -----------------------------------

def test_default_warmup_is_a_share_of_a_run_shorter_than_it():
    from llmkit.train.config import TrainConfig
    from llmkit.train.pretrain import PretrainConfig

    assert TrainConfig().warmup_steps == 100 and TrainConfig(max_steps=100).warmup_steps == 100
    assert TrainConfig(max_steps=20).warmup_steps == 2 and TrainConfig(max_steps=5).warmup_steps == 0
    cfg = resolve_config(PretrainConfig, parse_overrides(["max_steps=20"]))
    assert cfg.warmup_steps == 2 and cfg.train_config().warmup_steps == 2
    assert resolve_config(PretrainConfig, parse_overrides(["max_steps=20", "warmup_steps=none"])).warmup_steps == 2
    with pytest.raises(ConfigError, match=r"warmup_steps \(30\) exceeds max_steps \(20\)"):
        resolve_config(PretrainConfig, parse_overrides(["max_steps=20", "warmup_steps=30"]))
    # the fingerprinted config of a run with the default warmup is what it was before `None`
    assert config_to_dict(PretrainConfig())["warmup_steps"] == 100


# -- messages that say what to type -------------------------------------------------------------

def test_another_trainers_name_of_a_setting_suggests_llmkits():
    from llmkit.train.sft import SftConfig

    for theirs, ours in [("learning_rate", "lr"), ("gradient_accumulation_steps", "grad_accum"),
                         ("lora_r", "lora.r"), ("max_seq_length", "seq_len")]:
        with pytest.raises(ConfigError, match=rf"unknown key '{theirs}'; did you mean '{ours}'"):
            resolve_config(SftConfig, parse_overrides([f"{theirs}=1"]))


def test_a_set_value_that_breaks_a_check_with_a_recipe_value_names_the_recipe_setting_to_change():
    from llmkit.train.sft import SftConfig

    recipe = {"max_steps": 150, "warmup_steps": 10}
    with pytest.raises(ConfigError) as raised:
        resolve_config(SftConfig, recipe, parse_overrides(["max_steps=6"]))
    assert str(raised.value) == ("warmup_steps (10) exceeds max_steps (6); --set max_steps=6 meets "
                                 "warmup_steps=10 (the recipe's): set that too, e.g. --set warmup_steps=…")
    with pytest.raises(ConfigError) as raised:  # both typed: the message is enough
        resolve_config(SftConfig, recipe, parse_overrides(["max_steps=6", "warmup_steps=8"]))
    assert str(raised.value) == "warmup_steps (8) exceeds max_steps (6)"
    with pytest.raises(ConfigError, match=r"meets lr \(its default\): set that too, e.g. --set lr=…"):
        resolve_config(SftConfig, parse_overrides(["min_lr=1"]))
    with pytest.raises(ConfigError) as raised:  # the list of valid keys names no setting to change
        resolve_config(SftConfig, parse_overrides(["xyzzy=1", "max_steps=6"]))
    assert "meets" not in str(raised.value) and "valid keys" in str(raised.value)
