"""`llmkit export` on what users bring: an imported base model without a chat template exports to
both formats; --quant without --format gguf is refused by name; a q4_0 file says which matrices
stay F16 and why."""

import json

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from tests.tokenizers.test_tokenizer_json import QWEN_SPECIALS, save_folder, train_bpe
from tests.train.posttrain_fixtures import make_tokenizer, tiny_model, write_checkpoint_run

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py
runner = CliRunner()


def llmkit(*args):
    return runner.invoke(build_app(), [str(a) for a in args])


@pytest.fixture
def base_model_ws(tmp_path):
    """A workspace holding `base`: a tiny Qwen2 base model (its tokenizer has no chat template)."""
    import transformers

    folder = save_folder(tmp_path / "qwen-base", train_bpe(QWEN_SPECIALS), None, eos_token="<|endoftext|>")
    config = transformers.Qwen2Config(vocab_size=832, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    ws = tmp_path / "ws"
    r = llmkit("import", "--from", folder, "--out", "base", "-w", ws)
    assert r.exit_code == 0, r.output
    return ws


@pytest.mark.parametrize("fmt, record_in", [("hf", "export/hf"), ("gguf", "export/gguf-f16")])
def test_a_base_model_without_a_chat_template_exports_with_its_parity_measured(base_model_ws, fmt, record_in):
    r = llmkit("export", "--from", "base", "--format", fmt, "-w", base_model_ws)
    assert r.exit_code == 0, r.output
    record = json.loads((base_model_ws / record_in / "llmkit_export.json").read_text())
    assert record["probe"]["chat_template_equal"] is None  # no template: nothing to compare
    assert record["tokenizer_identical"] is True and record["max_abs_logit_diff"] < 1e-4


@pytest.fixture
def own_ws(tmp_path):
    """`pretrain`: an llmkit model of hidden size 48 (not a multiple of 32) and intermediate 64."""
    tok = make_tokenizer(tmp_path / "tok")
    write_checkpoint_run(tmp_path / "ws", "pretrain", tiny_model(tok.vocab_size, hidden_size=48), tok)
    return tmp_path / "ws"


@pytest.mark.parametrize("args", [["--quant", "q8_0"], ["--quant", "f16", "--format", "hf"],
                                  ["--set", "quant=q4_0"]])
def test_quant_without_format_gguf_exits_2_naming_both_options(own_ws, args):
    r = llmkit("export", "--from", "pretrain", *args, "-w", own_ws)
    assert r.exit_code == 2 and "--quant" in r.output and "--format gguf" in r.output, r.output
    assert "Traceback" not in r.output and not (own_ws / "export").exists()


def test_a_q4_0_file_names_the_matrices_that_stay_f16_and_why(own_ws):
    r = llmkit("export", "--from", "pretrain", "--format", "gguf", "--quant", "q4_0", "--set", "probe=false",
               "-w", own_ws)
    assert r.exit_code == 0, r.output
    # rows of 48 values (every matrix reading the hidden state) cannot be cut into blocks of 32;
    # ffn_down reads the 64 intermediate values: quantised
    assert "note: 13 of 15 matrices stay F16 in the q4_0 file (token_embd.weight, blk.0.ffn_gate.weight" in r.output
    assert "not a multiple of 32 values" in r.output
    record = json.loads((own_ws / "export/gguf-q4_0/llmkit_export.json").read_text())
    assert record["tensor_types"] == {"F16": 13, "Q4_0": 2, "F32": 5}
    assert len(record["f16_fallback_tensors"]) == 13 and "blk.1.ffn_down.weight" not in record["f16_fallback_tensors"]


def test_an_f16_file_has_no_fallback_note(own_ws):
    r = llmkit("export", "--from", "pretrain", "--format", "gguf", "--set", "probe=false", "-w", own_ws)
    assert r.exit_code == 0 and "stay F16" not in r.output, r.output
    assert json.loads((own_ws / "export/gguf-f16/llmkit_export.json").read_text())["f16_fallback_tensors"] == []
