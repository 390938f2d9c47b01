"""Data stages on a local Ray cluster (2 CPUs): the artifacts local runs make, whatever
happens to a worker or to the driver.

The identity tests run the CLI in this process (one Ray cluster for the module); the kill
tests run `llmkit` in a process group of its own, so that what Ray started dies with it, and
kill at named points (`core.durable.kill_point`): a worker once (`LLMKIT_KILL_ONCE`, so that
Ray's retry in a fresh worker goes through), the driver after some tasks finished. A cluster
that `ray start --head` runs from another directory (ports and temp dir of its own, stopped by
killing its session: `ray stop` would stop every Ray on the machine) is joined with relative
paths, and must never be joined without `ray.address`.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray

from llmkit.data.pipeline import part_path
from llmkit.errors import UserError
from tests.data.stage_tasks import (INGEST, RAW, STAGES, assert_same_artifact, build_workspace,
                                    llmkit)

ON_RAY = ["--executor", "ray", "--set", "run.ray.num_cpus=2"]


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
    from llmkit.core.executor import RayConfig, _run_on_ray
    from llmkit.core.progress import Progress

    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "executor-token").write_text("another node's disk")
    with pytest.raises(UserError, match="cannot see the workspace's work area .* every node "
                                        "must mount the workspace at the same path"):
        with Progress("t", total=1) as bar:
            _run_on_ray(print, [0], RayConfig(), None, bar, check=(str(tmp_path / "work"), "x"))


def command(ws: Path, *args) -> list[str]:
    return [sys.executable, "-c", "from llmkit.cli.app import main; main()",
            *[str(a).format(ws=ws) for a in args], "-w", str(ws)]


def run(ws: Path, *args, kill_at: str | None = None, once: Path | None = None,
        cwd: Path | None = None, env: dict | None = None):
    """`llmkit ARGS` in its own session (in `cwd`, `env` added); then whatever it started is
    killed."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("LLMKIT_KILL", "RAY_"))},
           **(env or {})}
    env.update(OMP_NUM_THREADS="1", **({"LLMKIT_KILL_AT": kill_at} if kill_at else {}),
               **({"LLMKIT_KILL_ONCE": str(once)} if once else {}))
    proc = subprocess.Popen(command(ws, *args), env=env, start_new_session=True, cwd=cwd,
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster_elsewhere(tmp_path_factory):
    """`ray start --head` run in a directory of its own: (its directory, the env that finds it
    with `ray.address=auto`: RAY_TMPDIR, where it wrote its address, short for Ray's sockets)."""
    where = tmp_path_factory.mktemp("cluster_dir")
    temp = Path(tempfile.mkdtemp(prefix="llmkit-ray-", dir="/tmp"))
    env = {"RAY_TMPDIR": str(temp)}
    ports = [f"--{name}={free_port()}" for name in ("port", "ray-client-server-port",
                                                    "dashboard-port",
                                                    "dashboard-agent-listen-port")]
    proc = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head",
                             "--block", "--num-cpus=2", "--include-dashboard=false",
                             "--disable-usage-stats", *ports],
                            cwd=where, env={**os.environ, **env, "RAY_ADDRESS": ""},
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        address_file = temp / "ray" / "ray_current_cluster"
        deadline = time.time() + 120
        while not address_file.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        assert address_file.exists(), "ray start --head did not come up"
        yield where, {**env, "address": address_file.read_text().strip()}
    finally:
        kill_session(proc.pid)
        shutil.rmtree(temp, ignore_errors=True)


def relative_inputs(here: Path) -> list[str]:
    """Input files under `here/data`, a broken one (locations in removed rows) and one without
    ids (generated from the path): the ingest arguments that name them, relative to `here`."""
    (here / "data").mkdir(parents=True)
    shutil.copy(RAW / "broken.jsonl", here / "data")
    shutil.copy(RAW / "noise.jsonl", here / "data")
    with open(RAW / "zh_poems.jsonl", encoding="utf-8") as f:
        texts = [json.loads(next(f))["text"] for _ in range(60)]
    (here / "data" / "no_ids.jsonl").write_text(
        "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts),
        encoding="utf-8")
    return ["data/broken.jsonl", "data/no_ids.jsonl", "data/noise.jsonl", "--set",
            "task_bytes=20000"]


def test_a_cluster_started_in_another_directory_runs_stages_given_relative_paths(
        cluster_elsewhere, tmp_path):
    where, env = cluster_elsewhere
    here = tmp_path / "here"
    files = relative_inputs(here)
    on_cluster = ["--executor", "ray", "--set", "run.ray.address=auto"]
    for ws, extra in ((Path("ws_local"), []), (Path("ws"), on_cluster)):
        for args in (["ingest", *files], ["clean", "--in", "{ws}/raw"]):  # a relative --in path
            code, out = run(ws, *args, *extra, cwd=here, env={"RAY_TMPDIR": env["RAY_TMPDIR"]})
            assert code == 0, out
    assert f"ray: the cluster at {env['address']} (ray.address=auto)" in out
    for artifact in ("raw", "clean"):
        assert_same_artifact(here / "ws_local" / artifact, here / "ws" / artifact)
    assert stats_of(here / "ws" / "raw")["rows_removed"] > 0  # locations named below the inputs' common folder
    assert list(where.iterdir()) == []  # nothing written where the cluster runs


@pytest.mark.parametrize("settings", [[], ["--set", "run.ray.num_cpus=1"]])
def test_without_an_address_a_run_starts_its_own_cluster_never_another_one(
        cluster_elsewhere, tmp_path, settings):
    """RAY_ADDRESS names the running cluster and it is the machine's last `ray start`: what
    `ray.init()` joins unasked (with num_cpus, it refused with a ValueError traceback)."""
    _, env = cluster_elsewhere
    files = relative_inputs(tmp_path)
    sessions = set((Path(env["RAY_TMPDIR"]) / "ray").glob("session_2*"))
    code, out = run(Path("ws"), "ingest", *files, "--executor", "ray", *settings, cwd=tmp_path,
                    env={"RAY_TMPDIR": env["RAY_TMPDIR"], "RAY_ADDRESS": env["address"]})
    assert code == 0, out
    assert "ray: a local cluster of " in out and ", for this run only" in out
    assert ("of 1 CPU," in out) == bool(settings)
    assert len(set((Path(env["RAY_TMPDIR"]) / "ray").glob("session_2*")) - sessions) == 1

