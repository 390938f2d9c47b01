import json

import pytest
import torch
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe
from tests.train.posttrain_fixtures import make_tokenizer, tiny_model, write_checkpoint_run

runner = CliRunner()


def left_in(ws) -> list[str]:
    """Whatever is in the workspace, hidden work areas and NAME.tmp-PID folders included."""
    return sorted(str(p.relative_to(ws)) for p in ws.rglob("*")) if ws.exists() else []


@pytest.fixture
def qwen_folder(tmp_path):
    """A tiny Qwen2 folder as save_pretrained writes it, tokenizer included."""
    import transformers

    folder = save_folder(tmp_path / "qwen", train_bpe(QWEN_SPECIALS), QWEN25_TEMPLATE, eos_token="<|im_end|>")
    config = transformers.Qwen2Config(vocab_size=832, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


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
    # the export has tokenizer.json beside tokenizer.model; llmkit's own sentencepiece model is the one kept
    carried = ws / "back" / "step-00000000" / "tokenizer"
    assert (carried / "tokenizer.model").is_file() and not (carried / "tokenizer.json").exists()


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
    assert left_in(tmp_path / "ws") == []


def test_a_malformed_tokenizer_config_exits_2_naming_it_and_leaves_nothing(qwen_folder, tmp_path):
    config = qwen_folder / "tokenizer_config.json"
    config.write_text(config.read_text()[:-20])  # cut mid-way, as by a failed copy
    ws = tmp_path / "ws"
    r = runner.invoke(build_app(), ["import", "--from", str(qwen_folder), "-w", str(ws)])
    assert r.exit_code == 2, r.output
    assert f"{config} is unreadable" in r.output
    assert left_in(ws) == []


def test_a_tokenizer_larger_than_the_embedding_leaves_nothing(qwen_folder, tmp_path):
    hf = json.loads((qwen_folder / "config.json").read_text())
    (qwen_folder / "config.json").write_text(json.dumps({**hf, "vocab_size": 100}))
    ws = tmp_path / "ws"
    r = runner.invoke(build_app(), ["import", "--from", str(qwen_folder), "-w", str(ws)])
    assert r.exit_code == 2, r.output
    assert left_in(ws) == []


def test_a_truncated_gguf_file_exits_2_naming_it_and_leaves_nothing(tmp_path):
    import gguf  # a dev dependency: a missing one fails here, never skips
    import numpy as np

    whole, cut = tmp_path / "whole.gguf", tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(whole), "llama")
    writer.add_block_count(1)
    writer.add_context_length(16)
    writer.add_tensor("token_embd.weight", np.ones((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    cut.write_bytes(whole.read_bytes()[:100])  # a download cut short, inside the header
    ws = tmp_path / "ws"
    r = runner.invoke(build_app(), ["import", "--from", str(cut), "-w", str(ws)])
    assert r.exit_code == 2, r.output
    assert f"{cut}: transformers cannot read this GGUF file" in r.output and "complete" in r.output
    assert left_in(ws) == []
