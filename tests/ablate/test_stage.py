"""`llmkit ablate` end to end on a tiny token workspace: 2 variants × 2 seeds of a few pretraining
steps, a second invocation that does nothing, a run lost and redone with identical results, and
`llmkit report` showing the tables."""

import json
import shutil

import pytest
import yaml

from tests.train.test_pretrain import TINY, llmkit, token_workspace

STEPS = 4


def experiment(tmp_path, **changes) -> str:
    baseline = dict(s.split("=", 1) for s in TINY)
    baseline.update(max_steps=STEPS, eval_every=STEPS, save_every=STEPS)
    exp = {"stage": "pretrain", "args": ["--in", "tokens"], "baseline": baseline,
           "variants": {"wsd": {"lr_schedule": "wsd"}}, "seeds": [0, 1], "metric": ["val_loss", "final_loss"],
           **changes}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp))
    return str(path)


@pytest.fixture(scope="module")
def ablated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ablate")
    ws = token_workspace(tmp)
    out = llmkit("ablate", experiment(tmp), "-w", ws, "--out", "abl").output
    return ws, tmp, out


def test_every_variant_and_seed_runs_and_the_results_hold_them(ablated):
    ws, _, out = ablated
    art = ws / "abl"
    results = json.loads((art / "results.json").read_text())
    assert sorted(results["runs"]) == ["baseline-s0", "baseline-s1", "wsd-s0", "wsd-s1"]
    for name in results["runs"]:  # each a complete pretraining run of the user's tokens, in the ablate's workspace
        manifest = json.loads((art / "runs" / name / "manifest.json").read_text())
        assert manifest["stats"]["steps"] == STEPS and manifest["inputs"][0]["path"] == "tokens"
        assert manifest["config"]["seed"] == int(name[-1])
        assert manifest["config"]["lr_schedule"] == ("wsd" if name.startswith("wsd") else "cosine")
    cells = {(c["variant"], c["seed"]): c["values"]["val_loss"] for c in results["cells"]}
    val = results["metrics"]["val_loss"]
    assert val["variants"]["wsd"]["values"] == [cells[("wsd", 0)], cells[("wsd", 1)]]
    assert val["differences"]["wsd"]["mean"] == pytest.approx(
        (cells[("wsd", 0)] - cells[("baseline", 0)] + cells[("wsd", 1)] - cells[("baseline", 1)]) / 2)
    assert cells[("wsd", 0)] != cells[("baseline", 0)] and cells[("baseline", 0)] != cells[("baseline", 1)]
    assert (art / "val_loss.png").stat().st_size > 1000 and (art / "manifest.json").is_file()
    assert "| wsd | 2 |" in (art / "results.md").read_text() and "| wsd | 2 |" in out
    assert not (art / "run.json").exists()
    command = results["runs"]["wsd-s1"]["command"]  # what a user would type to rebuild the run
    assert command[:4] == ["llmkit", "pretrain", "--in", "tokens"] and "lr_schedule=wsd" in command


def test_a_second_invocation_does_nothing_and_says_so(ablated):
    ws, tmp, _ = ablated
    before = (ws / "abl" / "manifest.json").read_bytes()
    out = llmkit("ablate", experiment(tmp), "-w", ws, "--out", "abl").output
    assert "up to date" in out and "nothing to do" in out
    assert (ws / "abl" / "manifest.json").read_bytes() == before


def test_a_lost_run_is_redone_alone_with_identical_results(ablated):
    ws, tmp, _ = ablated
    art = ws / "abl"
    before = json.loads((art / "results.json").read_text())
    (art / "runs" / "wsd-s1" / "manifest.json").unlink()  # as a kill before the run's manifest leaves it
    out = llmkit("ablate", experiment(tmp), "-w", ws, "--out", "abl").output
    assert "wsd-s1: trained" in out and "baseline-s0: up to date" in out
    after = json.loads((art / "results.json").read_text())
    assert after["metrics"] == before["metrics"] and after["cells"] == before["cells"]


def test_report_shows_the_ablation(ablated):
    ws, _, _ = ablated
    llmkit("report", "abl", "-w", ws)
    summary = (ws / "report" / "abl" / "summary.md").read_text()
    assert "## Ablation abl" in summary and "| wsd | 2 |" in summary and "val_loss.png" in summary


def test_a_metric_the_stage_does_not_record_stops_at_the_first_run(ablated, tmp_path):
    ws, _, _ = ablated
    shutil.copytree(ws / "tokens", tmp_path / "ws" / "tokens")
    shutil.copytree(ws / "tokenizer", tmp_path / "ws" / "tokenizer")
    out = llmkit("ablate", experiment(tmp_path, metric="val_los", seeds=1), "-w", tmp_path / "ws", expect=2).output
    assert "metric 'val_los' is not there" in out and "val_loss" in out
    assert len(list((tmp_path / "ws" / "ablate" / "runs").glob("*/manifest.json"))) == 1
