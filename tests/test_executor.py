"""llmkit.executor: where a stage's tasks run, and what stays the same wherever they do."""

import sys

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.clean import CleanConfig
from llmkit.errors import UserError
from llmkit.executor import (RayConfig, run_tasks, see_workspace, worker_slot,
                             write_visibility_token)
from llmkit.workspace import Workspace
from tests.conftest import write_jsonl


@pytest.mark.parametrize("how", [["--executor", "ray"], ["--set", "executor=ray"], "recipe"])
def test_executor_ray_without_ray_exits_2_with_the_install_line(tmp_path, monkeypatch, how):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    docs = write_jsonl(tmp_path / "docs.jsonl", [{"text": "a few words of text"}])
    if how == "recipe":
        (tmp_path / "recipe.yaml").write_text("ingest:\n  executor: ray\n  ray: {address: auto}\n")
        how = ["--recipe", str(tmp_path / "recipe.yaml")]
    r = CliRunner().invoke(build_app(), ["ingest", str(docs), "-w", str(tmp_path / "ws"), *how])
    assert r.exit_code == 2 and "pip install 'llmkit[ray]'" in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "ws" / "raw").exists()


def test_an_unknown_executor_is_refused_naming_the_choices(tmp_path):
    r = CliRunner().invoke(build_app(), ["clean", "-w", str(tmp_path), "--executor", "slurm"])
    assert r.exit_code == 2 and "executor must be one of 'local', 'ray'" in r.output, r.output


def test_where_a_stage_runs_is_recorded_but_not_fingerprinted(tmp_path):
    ws = Workspace(tmp_path)
    here = ws.builder("clean", stage="clean", config=CleanConfig(), quiet=True)
    there = ws.builder("clean", stage="clean", quiet=True, config=CleanConfig(
        executor="ray", ray=RayConfig(address="auto", cpus_per_task=2)))
    other = ws.builder("clean", stage="clean", config=CleanConfig(min_words=3), quiet=True)
    assert here.fingerprint == there.fingerprint != other.fingerprint
    assert there.config["executor"] == "ray" and there.config["ray"]["address"] == "auto"


def test_a_process_that_does_not_see_the_work_area_is_told_why(tmp_path):
    check = write_visibility_token(tmp_path / "work")
    see_workspace(check)  # the driver's own view
    for other in ((check[0], "another token"), (str(tmp_path / "elsewhere"), check[1])):
        with pytest.raises(UserError, match="every node must mount the workspace at the same "
                                            "path"):
            see_workspace(other)


def record_slot(path):
    path.write_text(repr(worker_slot()))


def test_each_local_worker_process_has_a_slot_of_its_own(tmp_path):
    """What ppl-filter's tasks take a device by: (index, pool size) in a pool, None here."""
    files = [tmp_path / f"task{i}" for i in range(6)]
    run_tasks(record_slot, files, label="slots", workers=2)
    assert {f.read_text() for f in files} <= {"(0, 2)", "(1, 2)"}
    run_tasks(record_slot, files[:1], label="slots")
    assert files[0].read_text() == "None"


@pytest.mark.parametrize("bad", [{"cpus_per_task": 0}, {"max_retries": -1}, {"num_cpus": 0}])
def test_ray_settings_are_checked(bad):
    from llmkit.errors import ConfigError

    with pytest.raises(ConfigError, match="ray."):
        RayConfig(**bad)
