import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

from llmkit.errors import UserError
from llmkit.workspace import Workspace, acquire_lock


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
        from llmkit.workspace import Workspace
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
