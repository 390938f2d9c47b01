"""What `export --format gguf` reads without loading the model (llmkit.hf.gguf_source): a
checkpoint's arrays straight from its safetensors file equal the loaded model's tensors (float32,
bf16, tied and untied), a LoRA checkpoint or an export that runs the model still loads it, and the
writer that packs the vocabulary whole writes the bytes gguf's own writer writes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from llmkit.checkpoints.loading import load
from llmkit.hf.gguf_source import CheckpointArrays, export_source, read_arrays, vocabulary_writer
from tests.train.posttrain_fixtures import make_tokenizer, tiny_model, write_checkpoint_run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("tied", [True, False])
def test_the_files_arrays_are_the_loaded_models_tensors(tokenizer, tmp_path, tied):
    run = write_checkpoint_run(tmp_path, "run", tiny_model(tokenizer.vocab_size, tie_embeddings=tied), tokenizer)
    arrays, their_tokenizer = export_source(run, needs_model=False)
    model, _ = load(run)
    assert isinstance(arrays, CheckpointArrays) and their_tokenizer.vocab_size == tokenizer.vocab_size
    theirs = model.state_dict()
    assert sorted(arrays.state_dict()) == sorted(theirs)
    for name, array in arrays.state_dict().items():
        assert array.dtype == np.float32 and np.array_equal(array, theirs[name].numpy()), name
    assert arrays.num_parameters() == model.num_parameters()
    if tied:  # one array under both names, as the model's one Parameter
        assert arrays.state_dict()["lm_head.weight"] is arrays.state_dict()["model.embed_tokens.weight"]
    model_again, _ = export_source(run, needs_model=True)  # the probe and the ship check run the model
    assert isinstance(model_again, torch.nn.Module)


def test_bf16_tensors_widen_exactly(tmp_path):
    from safetensors.torch import save_file

    values = torch.randn(3, 8).to(torch.bfloat16)
    save_file({"w": values, "f": torch.randn(4), "h": torch.randn(2, 2).half()}, str(tmp_path / "x.safetensors"))
    arrays = read_arrays(tmp_path / "x.safetensors")
    assert arrays["w"].dtype == np.float32 and np.array_equal(arrays["w"], values.float().numpy())
    assert arrays["h"].dtype == np.float16


def test_the_vocabulary_writer_writes_ggufs_bytes(tmp_path):
    def write(writer):
        writer.add_tokenizer_model("llama")
        writer.add_token_list(["<s>", "a", "中文", "▁b", b"\xff\xfe"])
        writer.add_token_scores([0.0, -1.5, 2.25, 1e-8, -3.0])
        writer.add_token_types([3, 1, 1, 1, 6])
        writer.add_token_merges(["a b", "c d"])
        writer.add_array("test.ints", [1, -2, 70000])
        writer.add_array("test.bools", [True, False])
        writer.add_array("test.nested", [[1, 2], [3]])
        writer.add_tensor("t", np.arange(8, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    write(gguf.GGUFWriter(str(tmp_path / "gguf.gguf"), "llama"))
    write(vocabulary_writer(tmp_path / "ours.gguf", "llama"))
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "gguf.gguf").read_bytes()
