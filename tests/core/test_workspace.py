import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmkit.errors import UserError
from llmkit.core.locks import acquire_lock, release_lock
from llmkit.core.workspace import Artifact, Workspace
from llmkit.core.durable import seal, sealed


@dataclass
class C:
    x: int = 1


def build(ws, name="a", x=1, inputs=(), force=False, content="hello"):
    b = ws.builder(name, stage="t", config=C(x), inputs=list(inputs), force=force)
    if b.up_to_date:
        return b
    with b:
        (b.dir / "data.txt").write_text(content)
        b.stats["rows_in"] = 1
    return b


def test_artifact_has_config_and_manifest_with_contract_keys(tmp_path):
    ws = Workspace(tmp_path)
    build(ws)
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    for key in ("stage", "llmkit_version", "created", "fingerprint", "inputs", "config",
                "seconds", "stats"):
        assert key in m
    assert (tmp_path / "a" / "config.yaml").read_text().strip() == "x: 1"
    assert not list(tmp_path.glob("a.tmp-*")) and not (tmp_path / "a.lock").exists()


def test_unchanged_fingerprint_is_up_to_date_and_untouched(tmp_path, capsys):
    ws = Workspace(tmp_path)
    build(ws)
    before = (tmp_path / "a" / "manifest.json").stat().st_mtime_ns
    assert build(ws, content="other").up_to_date
    assert "up to date" in capsys.readouterr().out
    assert (tmp_path / "a" / "manifest.json").stat().st_mtime_ns == before
    assert (tmp_path / "a" / "data.txt").read_text() == "hello"
    assert not build(ws, force=True, content="other").up_to_date
    assert (tmp_path / "a" / "data.txt").read_text() == "other"


def test_config_or_upstream_change_makes_downstream_stale(tmp_path):
    ws = Workspace(tmp_path)
    build(ws, "up")
    build(ws, "down", inputs=[ws.artifact("up")])
    assert build(ws, "down", inputs=[ws.artifact("up")]).up_to_date
    assert not build(ws, "down", x=2, inputs=[ws.artifact("up")]).up_to_date
    build(ws, "up", x=5)
    assert not build(ws, "down", x=2, inputs=[ws.artifact("up")]).up_to_date


def test_failed_build_leaves_no_artifact_and_no_lock(tmp_path):
    ws = Workspace(tmp_path)
    b = ws.builder("a", stage="t", config=C())
    with pytest.raises(RuntimeError):
        with b:
            (b.dir / "half").write_text("x")
            raise RuntimeError("boom")
    assert not (tmp_path / "a").exists() and not list(tmp_path.glob("a*"))
    with pytest.raises(UserError, match="no artifact .a."):
        ws.artifact("a")


def test_killed_stage_leaves_nothing_that_looks_complete(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal
        from dataclasses import dataclass
        from llmkit.core.workspace import Workspace
        @dataclass
        class C:
            x: int = 1
        b = Workspace({str(tmp_path)!r}).builder("a", stage="t", config=C())
        with b:
            (b.dir / "half").write_text("x")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    subprocess.run([sys.executable, "-c", script])
    assert not (tmp_path / "a" / "manifest.json").exists()
    with pytest.raises(UserError):
        Workspace(tmp_path).artifact("a")
    # the dead writer's lock is stale: the next build clears it and succeeds
    build(Workspace(tmp_path))
    assert Workspace(tmp_path).artifact("a").stats == {"rows_in": 1}
    assert not list(tmp_path.glob("a.tmp-*"))


def test_live_lock_refuses_a_second_writer(tmp_path):
    lock = acquire_lock(tmp_path / "a.lock")  # held by this (live) process
    with pytest.raises(UserError, match="being built by process"):
        build(Workspace(tmp_path))
    lock.unlink()


def test_incomplete_artifact_is_refused_as_input(tmp_path):
    (tmp_path / "half").mkdir()
    with pytest.raises(UserError, match="incomplete"):
        Workspace(tmp_path).artifact("half")


def _race_for_locks(root, rounds, start, results):

    sys.stderr = open(os.devnull, "w")  # the stale-lock warnings
    for i in range(rounds):
        lock = root / f"a{i}.lock"
        start.wait()
        try:
            won = acquire_lock(lock) == lock
        except UserError:
            won = False
        start.wait()  # every builder has tried before the winner lets go
        if won:
            release_lock(lock)
        results.put((i, won))


@pytest.mark.slow
def test_racing_builders_never_both_take_the_lock(tmp_path):
    import multiprocessing as mp

    rounds, builders = 600, 4
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    for i in range(1, rounds, 2):  # half the rounds start from a dead builder's lock
        (tmp_path / f"a{i}.lock").write_text(json.dumps({"pid": int(dead),
                                                         "host": socket.gethostname()}))
    ctx = mp.get_context("fork")
    start, results = ctx.Barrier(builders), ctx.Queue()
    procs = [ctx.Process(target=_race_for_locks, args=(tmp_path, rounds, start, results))
             for _ in range(builders)]
    for p in procs:
        p.start()
    winners = [0] * rounds
    for _ in range(rounds * builders):
        i, won = results.get(timeout=60)
        winners[i] += won
    for p in procs:
        p.join()
    assert [i for i, n in enumerate(winners) if n != 1] == []
    assert list(tmp_path.iterdir()) == []  # no lock, temp or stale file left


def test_an_empty_lock_is_one_being_written_then_stale(tmp_path, capsys):
    import threading

    lock = tmp_path / "a.lock"
    lock.write_text("")  # an older llmkit between creating its lock and writing it
    owner = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": 0})
    threading.Timer(0.1, lock.write_text, [owner]).start()
    with pytest.raises(UserError, match="being built by process"):
        acquire_lock(lock, wait_for_writer=5.0)
    lock.write_text("")  # never written: stale once the wait is over
    assert acquire_lock(lock, wait_for_writer=0.05) == lock
    assert "clearing stale lock" in capsys.readouterr().err


def test_inputs_are_recorded_relative_to_the_root_and_read_from_any_directory(tmp_path,
                                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    outside = tmp_path / "notes.txt"
    outside.write_text("x")
    ws = Workspace("ws")
    build(ws, "up")
    notes = Artifact(Path("notes.txt"), {"fingerprint": "f"})  # as ingest records its files
    b = build(ws, "down", inputs=[ws.artifact("up"), notes])
    recorded = [i["path"] for i in json.loads((b.final / "manifest.json").read_text())["inputs"]]
    assert recorded == ["up", str(outside)]  # inside: root-relative; outside: absolute
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    down = Workspace(tmp_path / "ws").artifact("down")
    assert [Path(i["path"]) for i in down.manifest["inputs"]] == [tmp_path / "ws" / "up", outside]


def test_old_manifests_with_paths_relative_to_the_working_directory_still_resolve(tmp_path,
                                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    ws = Workspace("ws")
    build(ws, "up")
    b = build(ws, "down", inputs=[ws.artifact("up")])
    m = json.loads((b.final / "manifest.json").read_text())
    m["inputs"][0]["path"] = "ws/up"  # what llmkit recorded before, run from tmp_path
    (b.final / "manifest.json").write_text(json.dumps(m))
    assert Path(ws.artifact("down").manifest["inputs"][0]["path"]) == Path("ws/up")


@pytest.mark.parametrize("typed,meant", [("rwa", "raw"), ("pretrian", "pretrain"),
                                         ("clena", "clean"), ("my_dta", "my_data")])
def test_a_mistyped_name_gets_the_closest_artifact(tmp_path, monkeypatch, typed, meant):
    monkeypatch.chdir(tmp_path)
    ws = Workspace("ws")
    build(ws, "my_data")
    with pytest.raises(UserError) as e:
        ws.artifact(typed)
    assert f"did you mean {meant!r}" in str(e.value)
    assert f"no artifact {typed!r} in workspace ./ws;" in str(e.value)


def test_the_default_workspace_is_named_as_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        Workspace("workspace").artifact("clean")
    assert "in workspace ./workspace; build it first with `llmkit clean`" in str(e.value)


def test_a_sealed_task_counts_only_while_its_files_are_intact(tmp_path):
    (tmp_path / "t").mkdir()
    data = tmp_path / "t" / "data.bin"
    data.write_bytes(b"12345")
    seal(tmp_path / "t.done", [data], {"rows": 5})
    assert sealed(tmp_path / "t.done") == {"rows": 5, "files": {"t/data.bin": 5}}
    data.write_bytes(b"123")  # cut short
    assert sealed(tmp_path / "t.done") is None
    data.unlink()
    assert sealed(tmp_path / "t.done") is None
    data.write_bytes(b"12345")
    (tmp_path / "t.done").write_text('{"rows": 5')  # a torn marker
    assert sealed(tmp_path / "t.done") is None


def test_kill_point_kills_at_the_named_pass_only(tmp_path):
    script = ("from llmkit.core.durable import kill_point\n"
              "for i in range(3):\n"
              "    kill_point('other'); kill_point('here'); print(i, flush=True)\n")
    env = {**os.environ, "LLMKIT_KILL_AT": "here@2"}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL and r.stdout.split() == ["0"]
    env["LLMKIT_KILL_AT"] = ""
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.split() == ["0", "1", "2"]


def test_a_run_killed_after_its_rename_leaves_a_lock_the_next_check_clears(tmp_path, capsys):
    script = textwrap.dedent(f"""
        from dataclasses import dataclass
        from llmkit.core.workspace import Workspace
        @dataclass
        class C:
            x: int = 1
        with Workspace({str(tmp_path)!r}).builder("a", stage="t", config=C()) as b:
            (b.work_dir / "task.bin").write_text("x")
    """)
    env = {**os.environ, "LLMKIT_KILL_AT": "renamed"}
    assert subprocess.run([sys.executable, "-c", script], env=env).returncode == -signal.SIGKILL
    assert (tmp_path / "a.lock").exists() and any((tmp_path / ".work").iterdir())
    assert build(Workspace(tmp_path)).up_to_date  # the artifact was complete
    assert not (tmp_path / "a.lock").exists() and not any((tmp_path / ".work").iterdir())
    assert "clearing stale lock" in capsys.readouterr().err
