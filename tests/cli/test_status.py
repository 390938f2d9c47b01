from dataclasses import dataclass

from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.core.workspace import Workspace


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
    rows = r.output.split("\n\n")[0].splitlines()[1:]  # the table, before the commands
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


def build_as(ws, name, argv, monkeypatch, **kw):
    """`build`, as the command `argv` would have (the manifest records sys.argv)."""
    monkeypatch.setattr("sys.argv", argv)
    return build(ws, name, **kw)


def output(*args) -> str:
    r = CliRunner().invoke(build_app(), ["status", *map(str, args)])
    assert r.exit_code == 0, r.output
    return r.output


def test_artifacts_are_listed_inputs_first_and_stale_ones_come_with_the_commands(tmp_path, monkeypatch):
    """Names in reverse alphabetical order of the pipeline: the order is the manifests' inputs'."""
    ws = Workspace(tmp_path / "ws")
    llmkit = "/venv/bin/llmkit"
    build_as(ws, "zeta", [llmkit, "t", "--out", "zeta"], monkeypatch)
    build_as(ws, "beta", [llmkit, "t", "--in", "zeta", "--out", "beta", "-w", "elsewhere"],
             monkeypatch, inputs=[ws.artifact("zeta")])
    build_as(ws, "alpha", [llmkit, "t", "--in", "beta", "--out", "alpha"], monkeypatch,
             inputs=[ws.artifact("beta")])
    build_as(ws, "other", ["pytest"], monkeypatch)  # not built by llmkit's command line
    assert list(status("-w", ws.root)) == ["other", "zeta", "beta", "alpha"]
    assert "to rebuild" not in output("-w", ws.root)

    build_as(ws, "zeta", [llmkit, "t", "--out", "zeta"], monkeypatch, x=2)  # zeta changes
    rows = status("-w", ws.root)
    assert {name: row[1] for name, row in rows.items()} == {
        "other": "done", "zeta": "done", "beta": "stale", "alpha": "stale"}
    todo = output("-w", ws.root).split("to rebuild, run in this order:\n")[1].splitlines()
    assert todo == [f"  llmkit t --in zeta --out beta -w {ws.root}  # beta stale: zeta changed",
                    f"  llmkit t --in beta --out alpha -w {ws.root}  # alpha stale: after beta"]


def test_a_deleted_input_is_missing_before_what_was_built_from_it(tmp_path, monkeypatch):
    import shutil

    ws = Workspace(tmp_path / "ws")
    build(ws, "clean")
    build(ws, "tokens", inputs=[ws.artifact("clean")])
    shutil.rmtree(ws.root / "clean")
    rows = status("-w", ws.root)
    assert list(rows) == ["clean", "tokens"]
    assert rows["clean"][:2] == ["clean", "missing"] and rows["tokens"][1] == "stale"
    todo = output("-w", ws.root).split("to rebuild, run in this order:\n")[1].splitlines()
    assert todo[0] == f"  llmkit clean -w {ws.root}  # clean missing"
    assert todo[1].endswith("# tokens stale: clean is missing")


def test_pipeline_order_breaks_ties_by_stage():
    from llmkit.status import ArtifactStatus, pipeline_order

    rows = [ArtifactStatus(n, s, "done", "", None, inputs) for n, s, inputs in [
        ("a_sft", "sft", ["b_pretrain", "sft_train"]), ("sft_train", "ingest", []),
        ("b_pretrain", "pretrain", ["tokens"]), ("tokens", "tokenize", ["raw"]),
        ("raw", "ingest", []), ("report/x", "report", [])]]
    assert [r.name for r in pipeline_order(rows)] == [
        "raw", "sft_train", "tokens", "b_pretrain", "a_sft", "report/x"]


def test_a_training_run_shows_the_threads_and_cpu_kernels_it_computed_on(tmp_path):
    ws = Workspace(tmp_path / "ws")
    with ws.builder("dpo", stage="dpo", config=C(), quiet=True) as b:
        b.stats.update(steps=1000, cpu_kernels="llmkit-avx512", threads={
            "setting": "auto", "start": 2, "steps": {"2": 40, "1": 960},
            "changes": [{"step": 41, "threads": 1, "why": "step times swing (9x the median)"}]})
    assert status("-w", ws.root)["dpo"][2:7] == ["1,000", "steps,", "1-2", "threads,", "llmkit-avx512"]
