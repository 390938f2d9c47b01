"""llmkit.core.executor: where a stage's tasks run, and what stays the same wherever they do."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.clean import CleanConfig
from llmkit.errors import UserError
from llmkit.core.executor import (RayConfig, RunsOn, run_tasks, see_workspace, worker_slot,
                             write_visibility_token)
from llmkit.core.workspace import Workspace
from tests.conftest import write_jsonl


@pytest.mark.parametrize("how", [["--executor", "ray"], ["--set", "run.executor=ray"], "recipe"])
def test_executor_ray_without_ray_exits_2_with_the_install_line(tmp_path, monkeypatch, how):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    docs = write_jsonl(tmp_path / "docs.jsonl", [{"text": "a few words of text"}])
    if how == "recipe":
        (tmp_path / "recipe.yaml").write_text("ingest:\n  run: {executor: ray, ray: {address: auto}}\n")
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
    there = ws.builder("clean", stage="clean", quiet=True, config=CleanConfig(run=RunsOn(
        executor="ray", workers=4, ray=RayConfig(address="auto", cpus_per_task=2))))
    other = ws.builder("clean", stage="clean", config=CleanConfig(min_words=3), quiet=True)
    assert here.fingerprint == there.fingerprint != other.fingerprint
    assert there.config["run"]["executor"] == "ray" and there.config["run"]["ray"]["address"] == "auto"


def test_the_work_area_is_checked_at_the_very_path_tasks_use(tmp_path, monkeypatch):
    """A relative path is what a task in another working directory (a Ray worker's is where its
    cluster started) fails on: the check must fail there too, saying why."""
    monkeypatch.chdir(tmp_path)
    check = write_visibility_token(Path("ws/.work/clean-x"))
    assert check[0] == "ws/.work/clean-x"
    see_workspace(check)
    monkeypatch.chdir(tmp_path / "ws")
    with pytest.raises(UserError, match="ws/.work/clean-x \\(a relative path, here read from "):
        see_workspace(check)


def test_a_cluster_that_cannot_be_joined_is_an_error_naming_the_setting(tmp_path):
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()  # a cluster an earlier test of this process left: llmkit would use it
    docs = write_jsonl(tmp_path / "docs.jsonl", [{"text": "a few words of text"}])
    r = CliRunner().invoke(build_app(), ["ingest", str(docs), "-w", str(tmp_path / "ws"),
                                         "--executor", "ray", "--set", "run.ray.address=nohost"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "cannot join the Ray cluster at ray.address='nohost' (Invalid address format" in r.output


def test_a_broken_ray_install_fails_the_ray_tests_instead_of_skipping_them(tmp_path):
    (tmp_path / "ray").mkdir()
    # a dependency of Ray missing: ModuleNotFoundError, which importorskip took for "no Ray"
    (tmp_path / "ray" / "__init__.py").write_text("import a_dependency_of_ray_not_installed\n")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
                        "-p", "no:cacheprovider", str(root / "tests/data/test_on_ray.py")],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "a_dependency_of_ray_not_installed" in r.stdout, r.stdout[-2000:]


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


@pytest.mark.parametrize("bad", [{"cpus_per_task": 0}, {"max_retries": -1}, {"num_cpus": 0},
                                 {"address": "auto", "num_cpus": 2}])
def test_ray_settings_are_checked(bad):
    from llmkit.errors import ConfigError

    with pytest.raises(ConfigError, match="ray."):
        RayConfig(**bad)


def test_the_run_flags_fill_the_run_section_and_switching_them_rebuilds_nothing(tmp_path):
    """--executor/--workers are the flags of a data stage's `run` section (no --set rewriting):
    config.yaml records them, `llmkit config` shows the section, and a finished artifact stays
    up to date whatever they say next."""
    import yaml

    docs = write_jsonl(tmp_path / "docs.jsonl", [{"text": "a few words of text"}])
    ws, app = str(tmp_path / "ws"), build_app()
    r = CliRunner().invoke(app, ["ingest", str(docs), "-w", ws, "--workers", "2"])
    assert r.exit_code == 0, r.output
    run = yaml.safe_load((tmp_path / "ws" / "raw" / "config.yaml").read_text())["run"]
    assert (run["executor"], run["workers"], run["rank"]) == ("local", 2, None)
    again = CliRunner().invoke(app, ["ingest", str(docs), "-w", ws, "--executor", "ray",
                                     "--set", "run.ray.num_cpus=1"])
    assert again.exit_code == 0 and "raw: up to date" in again.output, again.output
    (tmp_path / "recipe.yaml").write_text("ingest:\n  run: {workers: 4}\n")
    shown = CliRunner().invoke(app, ["config", "ingest", "--recipe", str(tmp_path / "recipe.yaml"),
                                     "--set", "run.executor=ray"]).output.splitlines()
    assert {"  run:", "    executor: ray  # set", "    workers: 4  # recipe"} <= set(shown), shown
