"""What a new user is told when a command cannot go on: the command that fixes it, not a guess."""

import json

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(build_app(), list(map(str, args)))


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny Qwen2 folder as transformers' save_pretrained writes it."""
    import transformers

    from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe

    folder = save_folder(tmp_path_factory.mktemp("hf") / "Qwen-tiny", train_bpe(QWEN_SPECIALS), QWEN25_TEMPLATE,
                         eos_token="<|im_end|>")
    config = transformers.Qwen2Config(vocab_size=832, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("sharded", [False, True])
def test_training_from_a_hugging_face_folder_says_to_import_it_first(hf_folder, tmp_path, sharded):
    folder = hf_folder
    if sharded:  # big models ship model-0000N-of-0000M.safetensors and no model.safetensors
        folder = tmp_path / "Qwen-sharded"
        folder.mkdir()
        for f in hf_folder.iterdir():
            (folder / f.name.replace("model.safetensors", "model-00001-of-00001.safetensors")).symlink_to(f)
    for stage in ("sft", "dpo"):
        r = invoke(stage, "--from", folder, "-w", tmp_path / "ws")
        assert r.exit_code == 2 and "Traceback" not in r.output
        assert f"{folder} holds a Hugging Face transformers config.json" in r.output
        assert f"llmkit import --from {folder} --out NAME" in r.output
        assert "manifest" not in r.output and "interrupted" not in r.output


def test_ingest_of_records_without_the_kinds_shape_lists_the_shapes_it_reads(tmp_path):
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(200)))
    r = invoke("ingest", plain, "--kind", "sft", "-w", tmp_path / "ws")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "200 × missing_prompt — --kind sft reads `messages` (a list of {role, content} with an " \
           "assistant turn), or `prompt` (or `instruction`, + `input`) with `response` (or `output`)" in r.output
    r = invoke("ingest", plain, "--kind", "preference", "-w", tmp_path / "ws")
    assert r.exit_code == 2 and "--kind preference reads `prompt` with `chosen` and `rejected`" in r.output
