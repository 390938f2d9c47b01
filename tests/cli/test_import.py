import torch
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from tests.train.posttrain_fixtures import make_tokenizer, tiny_model, write_checkpoint_run

runner = CliRunner()


def test_import_takes_the_artifact_name_export_wrote(tmp_path):
    ws = tmp_path / "ws"
    tok = make_tokenizer(tmp_path / "tok")
    model = tiny_model(tok.vocab_size).eval()
    write_checkpoint_run(ws, "sft", model, tok)
    r = runner.invoke(build_app(), ["export", "--from", "sft", "-w", str(ws), "--set", "probe=false"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(build_app(), ["import", "--from", "export/hf", "--out", "back", "-w", str(ws)])
    assert r.exit_code == 0, r.output
    x = torch.tensor([[1, 5, 9]])
    with torch.no_grad():
        assert torch.equal(llmkit.load("back", workspace=ws)[0](x), model(x))


def test_import_of_a_missing_name_says_where_it_looked(tmp_path):
    r = runner.invoke(build_app(), ["import", "--from", "export/nothing", "-w", str(tmp_path / "ws")])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"neither {tmp_path / 'ws' / 'export' / 'nothing'} nor export/nothing exists" in r.output


def test_a_gguf_file_without_the_gguf_packages_names_the_install_line(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    r = runner.invoke(build_app(), ["import", "--from", str(tmp_path / "model.gguf"), "-w", str(tmp_path / "ws")])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "reading GGUF needs gguf: pip install 'llmkit[gguf]'" in r.output
    assert not (tmp_path / "ws" / "imported").exists()


def test_a_family_llmkit_does_not_implement_exits_2_naming_it(tmp_path):
    import json

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "gemma2", "vocab_size": 8}))
    r = runner.invoke(build_app(), ["import", "--from", str(tmp_path / "hf"), "-w", str(tmp_path / "ws")])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "model_type 'gemma2' is not supported; llmkit implements llama, mistral, mixtral, qwen2, qwen3" in r.output
