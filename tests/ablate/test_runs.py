"""Running the plan: every run once, a run after the runs it reads, several at a time in worker
processes; a run that fails stops the experiment naming its log; a finished run is said up to date.
The command line here is a stand-in that writes a manifest (the real stages run in test_stage.py)."""

import json
import time
from pathlib import Path

import pytest
import yaml

from llmkit.ablate.experiment import read_experiment
from llmkit.ablate.plan import make_plan
from llmkit.ablate.runs import run_all
from llmkit.core.workspace import Workspace
from llmkit.errors import UserError

CHAIN = {"steps": [{"stage": "pretrain", "args": ["--in", "tokens"], "baseline": {"max_steps": 3}},
                   {"stage": "sft", "args": ["--from", "{pretrain}", "--in", "sft_train"]}],
         "variants": {"wsd": {"pretrain": {"lr_schedule": "wsd"}}, "sft_lr": {"sft": {"lr": 7e-5}}},
         "seeds": [0, 1], "metric": "val_loss"}


def fake_llmkit(command: list[str]) -> None:
    """Writes the --out folder's manifest, after checking that what --from names is finished."""
    out = Path(command[command.index("--out") + 1])
    if "--from" in command:
        assert (Path(command[command.index("--from") + 1]) / "manifest.json").is_file(), command
    if (out / "manifest.json").is_file():
        print(f"{out.name}: up to date")
        return
    if "lr_schedule=wsd" in command and "--set" in command and out.name == "wsd-s1-pretrain" and \
            (out.parent / "fail").exists():
        print("error: planted failure")
        raise SystemExit(2)
    time.sleep(0.05)
    out.mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps({"fingerprint": out.name, "stats": {"val_loss": 1.0},
                                                   "finished": time.time(), "command": command}))


def plan_of(tmp_path: Path):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(CHAIN, sort_keys=False))
    runs = tmp_path / "abl" / "runs"
    return make_plan(read_experiment(path), Workspace(tmp_path), runs), runs


@pytest.mark.parametrize("processes", [1, 2])
def test_every_run_runs_once_after_the_runs_it_reads(tmp_path, processes):
    plan, runs = plan_of(tmp_path)
    outcome = run_all(plan, tmp_path, runs, fake_llmkit, processes=processes, threads=1)
    assert outcome == {r.name: "trained" for r in plan.runs}
    for run in plan.runs:
        manifest = json.loads((runs / run.name / "manifest.json").read_text())
        assert manifest["command"][:2] == [run.stage, *run.args[:1]] and "threads=1" in manifest["command"]
        for need in run.needs:
            assert json.loads((runs / need / "manifest.json").read_text())["finished"] <= manifest["finished"]
        assert (runs / f"{run.name}.log").read_text().startswith(f"$ llmkit {run.stage} ")
    assert run_all(plan, tmp_path, runs, fake_llmkit, processes=processes) == {r.name: "up to date" for r in plan.runs}


def test_a_failing_run_stops_the_experiment_naming_its_log(tmp_path):
    plan, runs = plan_of(tmp_path)
    runs.mkdir(parents=True)
    (runs / "fail").touch()
    with pytest.raises(UserError, match=r"(?s)run wsd-s1-pretrain failed \(exit 2\); its log .*wsd-s1-pretrain.log "
                                        r"ends:\n.*planted failure"):
        run_all(plan, tmp_path, runs, fake_llmkit)
    assert not (runs / "wsd-s1-sft").exists()  # what reads it never started
