"""Data stages on a local Ray cluster (2 CPUs): the artifacts local runs make, whatever
happens to a worker or to the driver.

The identity tests run the CLI in this process (one Ray cluster for the module); the kill
tests run `llmkit` in a process group of its own, so that what Ray started dies with it, and
kill at named points (`workspace.kill_point`): a worker once (`LLMKIT_KILL_ONCE`, so that
Ray's retry in a fresh worker goes through), the driver after some tasks finished.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmkit.data.pipeline import part_path
from llmkit.errors import UserError
from tests.data.stage_tasks import INGEST, STAGES, assert_same_artifact, build_workspace, llmkit

ray = pytest.importorskip("ray")

ON_RAY = ["--executor", "ray", "--set", "ray.num_cpus=2"]


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tok):
    yield build_workspace(tmp_path_factory.mktemp("ray") / "ws", tok)
    ray.shutdown()


@pytest.mark.parametrize("stage", STAGES)
def test_each_data_stage_on_ray_gives_the_local_artifact(ws, stage):
    artifact, args = STAGES[stage]
    llmkit(ws, *args, "--out", f"{artifact}_ray", *ON_RAY)
    assert_same_artifact(ws / artifact, ws / f"{artifact}_ray")
    assert "executor: ray" in (ws / f"{artifact}_ray" / "config.yaml").read_text()


def test_a_task_that_cannot_see_the_workspace_fails_with_the_reason(ws, tmp_path):
    from llmkit.executor import RayConfig, _run_on_ray
    from llmkit.progress import Progress

    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "executor-token").write_text("another node's disk")
    with pytest.raises(UserError, match="cannot see the workspace's work area .* every node "
                                        "must mount the workspace at the same path"):
        with Progress("t", total=1) as bar:
            _run_on_ray(print, [0], RayConfig(), None, bar, check=(str(tmp_path / "work"), "x"))


def command(ws: Path, *args) -> list[str]:
    return [sys.executable, "-c", "from llmkit.cli.app import main; main()",
            *[str(a).format(ws=ws) for a in args], "-w", str(ws)]


def run(ws: Path, *args, kill_at: str | None = None, once: Path | None = None):
    """`llmkit ARGS` in its own session; then whatever it started is killed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMKIT_KILL")}
    env.update(OMP_NUM_THREADS="1", **({"LLMKIT_KILL_AT": kill_at} if kill_at else {}),
               **({"LLMKIT_KILL_ONCE": str(once)} if once else {}))
    proc = subprocess.Popen(command(ws, *args), env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=300)
    kill_session(proc.pid)
    return proc.returncode, out


def kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid`: Ray's workers have process groups of their own
    (a killpg misses them), and one still running would seal a task after the test looked."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[3]) == sid:  # after the name: state, ppid, pgrp, session
                os.kill(int(stat.parent.name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass


@pytest.mark.parametrize("stage, point", [("clean", "map:batch"), ("dedup", "dedup:signatures"),
                                          ("ingest", "ingest:record@50")])
def test_a_worker_killed_mid_task_is_retried_and_the_artifact_is_unchanged(ws, stage, point):
    artifact, args = STAGES[stage]
    once = ws / f"killed-{stage}"
    code, out = run(ws, *args, "--out", f"{artifact}_killed", *ON_RAY, kill_at=point, once=once)
    assert code == 0, out
    assert once.exists()  # a worker did die there
    assert_same_artifact(ws / artifact, ws / f"{artifact}_killed")
    s = stats_of(ws / f"{artifact}_killed")
    assert s["rows_in"] == s["rows_out"] + s["rows_removed"]


def stats_of(path: Path) -> dict:
    import json

    return json.loads((path / "manifest.json").read_text())["stats"]


def test_a_killed_driver_resumes_from_the_finished_tasks(ws):
    args = [*INGEST, "--out", "raw_resumed", *ON_RAY]
    code, out = run(ws, *args, kill_at="ray:task_done@2")
    assert code == -signal.SIGKILL, out
    (work,) = (ws / ".work").glob("raw_resumed-*")
    done = {p.name: p.stat().st_mtime_ns for p in (work / "files").glob("*.done")}
    assert len(done) >= 2
    code, out = run(ws, *args, kill_at="commit")  # stops with the work area still there
    assert code == -signal.SIGKILL, out
    assert f"ingest: {len(done)} of 4 tasks already done (resumed)" in out
    assert {p: (work / "files" / p).stat().st_mtime_ns for p in done} == done  # not redone
    assert len(list((work / "files").glob("*.done"))) == 4
    code, out = run(ws, *args)
    assert code == 0, out
    assert_same_artifact(ws / "raw", ws / "raw_resumed")
    assert not part_path(work / "files", 0, ".done").exists()  # the work area is gone
