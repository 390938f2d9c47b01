import json
import subprocess
import sys

from typer.testing import CliRunner

from llmkit.cli.app import COMMANDS, build_app
from tests.conftest import write_jsonl

runner = CliRunner()


def test_help_does_not_import_torch_or_deepspeed():
    code = ("import sys; from llmkit.cli.app import build_app\n"
            "from typer.testing import CliRunner\n"
            "app = build_app()\n"
            "names = [c.name for c in app.registered_commands]\n"
            "assert 'ingest' in names and 'status' in names, names\n"
            "for args in [['--help']] + [[c, '--help'] for c in names]:\n"
            "    r = CliRunner().invoke(app, args); assert r.exit_code == 0, (args, r.output)\n"
            "bad = [m for m in ('torch', 'deepspeed', 'pyarrow', 'sentencepiece') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_command_table_lists_every_stage_of_the_design():
    assert list(COMMANDS) == ["ingest", "clean", "dedup", "ppl-filter", "tokenizer", "tokenize",
                              "pretrain", "sft", "rm", "dpo", "ppo", "eval", "generate",
                              "export", "import", "report", "status"]


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
