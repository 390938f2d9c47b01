import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app, command_line, main
from llmkit.stages import CONFIGURED, STAGES
from tests.conftest import write_jsonl

runner = CliRunner()


def test_help_does_not_import_torch_or_deepspeed():
    code = ("import sys; from llmkit.cli.app import build_app\n"
            "from typer.testing import CliRunner\n"
            "app = build_app()\n"
            "names = [c.name for c in app.registered_commands]\n"
            "assert 'ingest' in names and 'status' in names, names\n"
            "for args in [['--help'], ['--version']] + [[c, '--help'] for c in names]:\n"
            "    r = CliRunner().invoke(app, args); assert r.exit_code == 0, (args, r.output)\n"
            "bad = [m for m in ('torch', 'deepspeed', 'pyarrow', 'sentencepiece') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


STAGE_COMMANDS = [s.command for s in STAGES if s.kind != "helper"]


def test_command_table_lists_every_stage_of_the_design():
    assert STAGE_COMMANDS == ["ingest", "clean", "dedup", "ppl-filter", "decontaminate", "quality", "tokenizer",
                              "tokenize",
                              "pretrain", "sft", "rm", "dpo", "kto", "ppo", "distill", "eval", "generate", "judge",
                              "synth", "export", "import", "extend-vocab", "merge", "ablate", "report", "status"]


def test_helper_commands_come_after_the_stages():
    helpers = [s.command for s in STAGES if s.kind == "helper"]
    assert helpers == ["config"]
    names = [c.name for c in build_app().registered_commands]
    assert names == [*STAGE_COMMANDS, *helpers]


@pytest.mark.parametrize("stage", CONFIGURED)
def test_stage_help_ends_with_every_key_of_its_config(stage):
    """Every field of the stage's config class (nested sections' too), with its type, default
    and the comment beside it in the source."""
    from llmkit.core.config import dotted_keys
    from llmkit.core.keydocs import documented_keys
    from llmkit.stages import BY_COMMAND, config_class

    r = runner.invoke(build_app(), [stage, "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    head, sep, tail = r.output.partition("Config keys")
    assert sep and "--help" in head
    shown = [line.split(":", 1)[0].strip() for line in tail.splitlines()[2:] if line.strip()]
    assert shown == dotted_keys(config_class(stage))
    docs = {d.key: d for d in documented_keys(BY_COMMAND[stage].config)}
    for line in tail.splitlines()[2:]:
        doc = docs[line.split(":", 1)[0].strip()]
        assert line.strip().startswith(f"{doc.key}: {doc.type}")
        assert line.rstrip().endswith(f"# {doc.comment}" if doc.comment else doc.type if doc.section else "")
        if not doc.section and len(doc.default) <= 40:
            assert f" = {doc.default}" in line


def test_pretrain_help_shows_model_keys_with_type_default_and_comment():
    r = runner.invoke(build_app(), ["pretrain", "--help"], terminal_width=200)
    lines = [" ".join(line.split()) for line in r.output.splitlines()]
    assert "model.n_layers: int | None = null # transformer blocks" in lines
    assert "max_steps: int = 1000 # optimizer steps of the whole run" in lines
    assert any(line.startswith("warmup_steps: int | None = null # linear warmup") for line in lines)


def test_unknown_set_key_exits_2_naming_the_closest_key(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [{"text": "x"}])
    r = runner.invoke(build_app(), ["ingest", str(p), "-w", str(tmp_path / "ws"),
                                    "--set", "text_feild=body"])
    assert r.exit_code == 2
    assert "text_feild" in r.output and "text_field" in r.output
    assert "Traceback" not in r.output


def test_recipe_then_set_precedence_and_workspace_env(tmp_path, monkeypatch):
    p = write_jsonl(tmp_path / "d.jsonl", [{"body": "x"}])
    recipe = tmp_path / "r.yaml"
    recipe.write_text("ingest:\n  text_field: body\n  source: from-recipe\n")
    monkeypatch.setenv("LLMKIT_WORKSPACE", str(tmp_path / "envws"))
    r = runner.invoke(build_app(), ["ingest", str(p), "--recipe", str(recipe),
                                    "--set", "source=from-set"])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "envws" / "raw" / "manifest.json").read_text())
    assert m["config"]["text_field"] == "body" and m["config"]["source"] == "from-set"


def test_rerun_prints_up_to_date_and_status_lists_artifacts(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [{"text": "x"}])
    args = ["ingest", str(p), "-w", str(tmp_path / "ws")]
    assert runner.invoke(build_app(), args).exit_code == 0
    r = runner.invoke(build_app(), args)
    assert r.exit_code == 0 and "up to date" in r.output
    r = runner.invoke(build_app(), ["status", "-w", str(tmp_path / "ws")])
    assert "raw" in r.output and "done" in r.output
    p.write_text('{"text": "changed"}\n')
    r = runner.invoke(build_app(), ["status", "-w", str(tmp_path / "ws")])
    assert "stale" in r.output


def test_version_prints_the_package_version():
    r = runner.invoke(build_app(), ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"llmkit {llmkit.__version__}"


@pytest.mark.parametrize("launcher_args, where", [
    (["--local_rank=0"], "first"),      # deepspeed: `python -u llmkit --local_rank=0 pretrain …`
    (["--local-rank", "1"], "last"),    # torch.distributed.launch, after the stage's arguments
])
def test_launcher_local_rank_is_accepted_and_ignored(tmp_path, capsys, launcher_args, where):
    p = write_jsonl(tmp_path / "d.jsonl", [{"text": "x"}])
    args = ["ingest", str(p), "-w", str(tmp_path / "ws")]
    with pytest.raises(SystemExit) as exit_:
        main(launcher_args + args if where == "first" else args + launcher_args)
    assert exit_.value.code == 0, capsys.readouterr()
    assert (tmp_path / "ws" / "raw" / "manifest.json").is_file()


def test_several_pairs_after_one_set_are_several_settings(tmp_path, capsys):
    p = write_jsonl(tmp_path / "d.jsonl", [{"body": "x"}])
    with pytest.raises(SystemExit) as exit_:
        main(["ingest", str(p), "-w", str(tmp_path / "ws"), "--set", "text_field=body", "source=web"])
    assert exit_.value.code == 0, capsys.readouterr()
    m = json.loads((tmp_path / "ws" / "raw" / "manifest.json").read_text())
    assert m["config"]["text_field"] == "body" and m["config"]["source"] == "web"
    assert command_line(["dedup", "--set", "a=1", "b.c=2", "--in", "x", "--set=d=3", "e=4"]) == [
        "dedup", "--set", "a=1", "--set", "b.c=2", "--in", "x", "--set=d=3", "--set", "e=4"]


def test_two_pairs_in_one_set_value_are_refused_with_the_fix(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [{"body": "x"}])
    r = runner.invoke(build_app(), ["ingest", str(p), "-w", str(tmp_path / "ws"),
                                    "--set", "text_field=body source=web"])
    assert r.exit_code == 2 and "--set text_field=body --set source=web" in r.output
    assert "Traceback" not in r.output


def test_a_key_of_a_section_given_bare_suggests_the_dotted_key(tmp_path):
    r = runner.invoke(build_app(), ["dedup", "-w", str(tmp_path / "ws"), "--set", "threshold=0.8"])
    assert r.exit_code == 2 and "did you mean 'minhash.threshold'" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("command, has, lacks", [
    ("status", ["--workspace"], ["--recipe", "--set", "--in", "--out", "--force", "--workers", "--rank"]),
    ("generate", ["--set", "--recipe"], ["--in", "--out", "--force", "--workers"]),
    ("report", ["--set"], ["--in", "--out", "--force", "--workers"]),
    ("export", ["--out", "--force"], ["--in", "--workers"]),
    ("import", ["--out", "--force"], ["--in", "--workers"]),
    ("ingest", ["--out", "--force", "--allow-empty", "--workers", "--rank", "--executor"], ["--in"]),
    ("sft", ["--in", "--out", "--force"], ["--workers", "--rank", "--allow-empty"]),
    ("clean", ["--in", "--out", "--force", "--workers", "--allow-empty", "--rank", "--executor"], []),
    ("ppl-filter", ["--in", "--workers", "--rank", "--world-size", "--executor"], []),
    ("tokenize", ["--in", "--workers", "--rank", "--world-size", "--executor"], []),
    ("dedup", ["--in", "--workers", "--rank", "--world-size", "--executor"], []),
    ("sft", ["--in"], ["--executor"]),
])
def test_each_command_lists_only_the_common_options_it_uses(command, has, lacks):
    r = runner.invoke(build_app(), [command, "--help"])
    options = {word.rstrip(",") for line in r.output.splitlines() for word in line.split()
               if word.startswith("--")}
    assert set(has) <= options and not set(lacks) & options, options
    if "--force" in lacks:
        r = runner.invoke(build_app(), [command, "--force"])
        assert r.exit_code == 2 and "No such option: --force" in r.output


def test_allow_empty_writes_the_empty_output_a_plain_run_refuses(tmp_path):
    from tests.conftest import write_jsonl

    data = write_jsonl(tmp_path / "docs.jsonl", [{"id": "a", "body": "no text field here"}])
    ws = str(tmp_path / "ws")
    refused = runner.invoke(build_app(), ["ingest", str(data), "-w", ws])
    assert refused.exit_code == 2 and "--text-field body" in " ".join(refused.output.split())
    kept = runner.invoke(build_app(), ["ingest", str(data), "-w", ws, "--allow-empty"])
    assert kept.exit_code == 0, kept.output
    stats = json.loads((tmp_path / "ws" / "raw" / "manifest.json").read_text())["stats"]
    assert (stats["rows_out"], stats["rows_removed"]) == (0, 1)
