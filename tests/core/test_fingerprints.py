"""A setting added by a later llmkit, at its default, leaves an earlier artifact up to date; the
same setting at another value, or a recorded setting changed, makes it stale."""

import json
from dataclasses import dataclass, field

from llmkit.core.fingerprints import without_later_defaults
from llmkit.core.workspace import Workspace


@dataclass
class Section:
    width: int | None = None


@dataclass
class Before:  # what an earlier llmkit knew
    lr: float = 1e-3
    model: Section = field(default_factory=Section)


@dataclass
class LaterSection:
    width: int | None = None
    shared_expert_size: int | None = None  # added later: None does what the earlier model did


@dataclass
class After:  # the same stage, two settings later
    lr: float = 1e-3
    model: LaterSection = field(default_factory=LaterSection)
    packing: bool = False


def built(ws, config, name="run", inputs=()):
    b = ws.builder(name, stage="t", config=config, inputs=list(inputs))
    if not b.up_to_date:
        with b:
            (b.dir / "weights").write_text(repr(config))
    return b


def test_settings_added_later_at_their_defaults_keep_the_artifact_and_its_fingerprint(tmp_path):
    ws = Workspace(tmp_path)
    first = built(ws, Before(model=Section(width=8)))
    again = built(ws, After(model=LaterSection(width=8)))
    assert again.up_to_date
    assert again.fingerprint == first.fingerprint  # what downstream artifacts recorded
    assert (tmp_path / "run" / "weights").read_text() == repr(Before(model=Section(width=8)))
    # downstream of it, nothing is stale either
    down = built(ws, Before(), name="down", inputs=[ws.artifact("run")])
    assert built(ws, After(), name="down", inputs=[ws.artifact("run")]).fingerprint == down.fingerprint


def test_a_later_setting_away_from_its_default_or_a_recorded_one_changed_rebuilds(tmp_path):
    ws = Workspace(tmp_path)
    built(ws, Before())
    assert not ws.builder("run", stage="t", config=After(packing=True), inputs=[]).up_to_date
    assert not ws.builder("run", stage="t", config=After(model=LaterSection(shared_expert_size=4)),
                          inputs=[]).up_to_date
    assert not ws.builder("run", stage="t", config=After(lr=2e-3), inputs=[]).up_to_date


def test_a_default_changed_since_is_no_later_setting():
    recorded = {"lr": 1e-3, "model": {"width": None}}
    # `lr` was recorded: a new default for it is a change, kept in the hash
    assert without_later_defaults({"lr": 3e-4, "model": {"width": None}}, recorded,
                                  {"lr": 3e-4, "model": {"width": None}}) == {"lr": 3e-4, "model": {"width": None}}
    assert without_later_defaults({"lr": 1e-3, "model": {"width": None, "gate": None}, "seed": 0}, recorded,
                                  {"lr": 1e-3, "model": {"width": None, "gate": None}, "seed": 0}) == recorded


def test_a_manifest_without_a_config_compares_by_fingerprint_alone(tmp_path):
    ws = Workspace(tmp_path)
    built(ws, Before())
    manifest = tmp_path / "run" / "manifest.json"
    m = json.loads(manifest.read_text())
    del m["config"]
    manifest.write_text(json.dumps(m))
    assert ws.builder("run", stage="t", config=Before(), inputs=[]).up_to_date
    assert not ws.builder("run", stage="t", config=After(), inputs=[]).up_to_date


def test_a_config_given_as_a_dict_names_its_defaults(tmp_path):
    # export's config is its settings plus what it reads (the weights' size and time stamp)
    ws = Workspace(tmp_path)
    built(ws, {"quant": "f16", "source_bytes": 10})
    settings = {"quant": "f16", "imatrix": "", "source_bytes": 10}
    assert not ws.builder("run", stage="t", config=settings, inputs=[]).up_to_date
    assert ws.builder("run", stage="t", config=settings, inputs=[], defaults={"quant": "f16", "imatrix": ""}).up_to_date
