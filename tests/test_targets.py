"""A path the user names is theirs: every command that writes refuses, with exit 2 and before it
reads or writes anything, an --out/--to that would replace what llmkit did not build."""

import json
import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.errors import UserError
from llmkit.stages import BY_COMMAND, STAGES
from llmkit.core.targets import check_target

runner = CliRunner()
APP = build_app()
COMMANDS = typer.main.get_command(APP).commands


def writes(command: str) -> list[str]:
    """The options through which `command` names where it writes."""
    return [o for p in COMMANDS[command].params if p.param_type_name == "option"
            for o in p.opts if o in ("--out", "--to")]


WRITERS = [s.command for s in STAGES if writes(s.command)]


def required_args(command: str) -> list[str]:
    """A placeholder for each argument the command requires, so that it parses."""
    args = []
    for p in COMMANDS[command].params:
        if p.required:
            args += ["x"] if p.param_type_name == "argument" else [p.opts[0], "x"]
    return args


def test_the_guard_covers_every_command_of_the_table_that_writes():
    assert {"ingest", "clean", "pretrain", "sft", "dpo", "judge", "export", "import", "eval",
            "quality", "extend-vocab"} <= set(WRITERS)


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's project with its own files, the workspace inside it, and a folder outside both."""
    project = tmp_path / "project"
    (project / "ws").mkdir(parents=True)
    (project / "train.py").write_text("print('mine')\n")
    (project / "NOTES.md").write_text("notes\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep\n")
    monkeypatch.chdir(project)
    return project


def plant(ws: Path, command: str, other_stage: str) -> None:
    """User files and artifacts where `command` writes (the workspace, or eval/ for eval)."""
    folder = ws / BY_COMMAND[command].folder
    (folder / "notes").mkdir(parents=True, exist_ok=True)
    (folder / "notes" / "todo.txt").write_text("todo\n")
    (folder / "notes.txt").write_text("a user's file\n")
    for name, stage in (("other", other_stage), ("mine", command)):
        (folder / name).mkdir(exist_ok=True)
        (folder / name / "manifest.json").write_text(json.dumps({"stage": stage, "fingerprint": "f"}))
        (folder / name / "part-00000.parquet").write_bytes(b"data")


def hostile_targets(project: Path, option: str) -> dict[str, str]:
    """target -> what the refusal says. --out names an artifact in the workspace, --to a path."""
    ws, here = project / "ws", "ws/" if option == "--to" else ""
    return {".": "refusing", "..": "refusing", str(ws): "the workspace",
            str(project.parent / "outside"): "did not write",
            f"{here}notes.txt": "a file llmkit did not write", f"{here}notes": "did not write",
            f"{here}other": "holds an artifact built by"}


@pytest.mark.parametrize("command", WRITERS)
def test_every_command_refuses_to_write_over_what_llmkit_did_not_build(project, command):
    ws = project / "ws"
    other = "tokenizer" if command != "tokenizer" else "clean"
    plant(ws, command, other)
    before = {"project": tree(project), "outside": tree(project.parent / "outside")}
    base = [command, *required_args(command), "-w", str(ws)]
    for option in writes(command):
        for target, said in hostile_targets(project, option).items():
            r = runner.invoke(APP, [*base, option, target])
            assert r.exit_code == 2, (option, target, r.output)
            assert said in r.output and "Traceback" not in r.output, (option, target, r.output)
        # the command's own input, even with --force
        reads = "--from" if command == "export" else "--in"
        if reads in {o for p in COMMANDS[command].params for o in p.opts}:
            own = ("ws/" if option == "--to" else "") + "mine"
            r = runner.invoke(APP, [command, *required_args(command), "-w", str(ws), reads, "mine",
                                    option, own, "--force"])
            assert r.exit_code == 2 and "own input" in r.output, (option, r.output)
    assert {"project": tree(project), "outside": tree(project.parent / "outside")} == before
    assert not [p for p in ws.rglob("*") if ".tmp-" in p.name or p.name.endswith(".lock")]
    assert not (ws / ".work").exists() or not any((ws / ".work").iterdir())


def test_an_llmkit_artifact_of_the_same_stage_and_kind_is_replaced(tmp_path):
    ws = tmp_path / "ws"
    (ws / "clean").mkdir(parents=True)
    (ws / "clean" / "manifest.json").write_text(json.dumps({"stage": "clean"}))
    check_target(ws / "clean", root=ws, stage="clean", kind="clean")
    with pytest.raises(UserError, match="built by `llmkit clean`"):
        check_target(ws / "clean", root=ws, stage="quality", kind="quality")
    check_target(ws / "clean", root=ws, stage="quality", kind="quality", force=True)


def test_a_classifier_and_a_dataset_of_one_stage_do_not_replace_each_other(tmp_path):
    ws = tmp_path / "ws"
    (ws / "quality_model").mkdir(parents=True)
    (ws / "quality_model" / "manifest.json").write_text(json.dumps({"stage": "quality", "kind": "classifier"}))
    with pytest.raises(UserError, match=r"built by `llmkit quality` \(classifier\)"):
        check_target(ws / "quality_model", root=ws, stage="quality", kind="quality")
    check_target(ws / "quality_model", root=ws, stage="quality", kind="classifier")
    check_target(ws / "quality_model", root=ws, stage="quality")  # the command line: any kind


def test_a_training_run_not_finished_counts_as_llmkit_s_own(tmp_path):
    run = tmp_path / "ws" / "sft"
    (run / "step-00000010").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    check_target(run, root=tmp_path / "ws", stage="sft")


def test_a_path_inside_an_artifact_or_holding_an_input_is_refused(tmp_path):
    ws = tmp_path / "ws"
    (ws / "clean").mkdir(parents=True)
    (ws / "clean" / "manifest.json").write_text(json.dumps({"stage": "clean"}))
    with pytest.raises(UserError, match="inside the artifact"):
        check_target(ws / "clean" / "sub", root=ws, stage="dedup")
    with pytest.raises(UserError, match="own input"):
        check_target(ws / "clean", root=ws, stage="clean", inputs=[ws / "clean" / "part-0.parquet"], force=True)


def test_a_new_or_empty_folder_anywhere_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "new" / "deeper", Path(os.sep) / "tmp" / "llmkit-never-made"):
        check_target(target, root=tmp_path / "ws", stage="export")


def test_a_second_gguf_quant_goes_to_its_own_folder():
    from llmkit.hf.export import ExportConfig, default_folder

    assert default_folder(ExportConfig(format="gguf", quant="q8_0")) != default_folder(
        ExportConfig(format="gguf", quant="f16"))
    assert default_folder(ExportConfig()) == "export/hf"
