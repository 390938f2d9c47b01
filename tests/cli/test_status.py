from dataclasses import dataclass

from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.workspace import Workspace


@dataclass
class C:
    x: int = 1


def build(ws, name, x=1, inputs=()):
    with ws.builder(name, stage="t", config=C(x), inputs=list(inputs), quiet=True) as b:
        (b.dir / "data.txt").write_text("hello")
        b.stats["rows_out"] = 3
    return b


def status(*args) -> dict[str, list[str]]:
    """`llmkit status` as {artifact: [stage, state, size...]} (plain output, not a terminal)."""
    r = CliRunner().invoke(build_app(), ["status", *map(str, args)])
    assert r.exit_code == 0, r.output
    rows = r.output.splitlines()[1:]
    return {line[:20].strip(): line[20:].split() for line in rows if line[:20].strip()}


def test_artifacts_read_the_same_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ws = Workspace("ws")  # relative, as `-w ws` gives it
    build(ws, "up")
    build(ws, "down", inputs=[ws.artifact("up")])
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert status("-w", tmp_path / "ws")["down"][:2] == ["t", "done"]
    monkeypatch.chdir(tmp_path)
    build(ws, "up", x=2)  # a changed input still shows
    assert status("-w", "ws")["down"][:2] == ["t", "stale"]


def test_a_stopped_training_run_is_incomplete_at_its_newest_complete_step(tmp_path):
    run = tmp_path / "ws" / "pretrain"
    for step, complete in ((2, True), (4, True), (6, False)):  # step 6: its save was cut
        (run / f"step-{step:08d}").mkdir(parents=True)
        if complete:
            (run / f"step-{step:08d}" / "complete").write_text("")
    (run / "run_fingerprint").write_text("abc\n")
    assert status("-w", tmp_path / "ws")["pretrain"][1:4] == ["incomplete", "step", "4"]


def test_reports_are_listed(tmp_path):
    report = tmp_path / "ws" / "report" / "runs"
    report.mkdir(parents=True)
    (report / "summary.md").write_text("# runs\n")
    (report / "loss.png").write_bytes(b"png")
    assert status("-w", tmp_path / "ws")["report/runs"][:4] == ["report", "done", "1", "plots"]


def test_an_empty_workspace_is_named_as_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(build_app(), ["status", "-w", "workspace"])
    assert r.exit_code == 0 and "workspace ./workspace has no artifacts yet" in r.output
