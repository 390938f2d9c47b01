"""`model.rope_scaling` as a user writes it: bad input (an unknown kind or key, a factor <= 1, yarn
without its original context, longrope's factor lists of the wrong length) is a ConfigError naming
the key, and exit 2 from `pretrain` and `sft`; a context extension on a run that starts from a
trained model (`pretrain --from`, `sft` with `--set model.rope_scaling=…`) trains at the longer
length and leaves step folders that carry the scaling, which `export` writes for transformers and
`import` reads back."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from typer.testing import CliRunner

import llmkit

from llmkit.checkpoints import step_folders as ckpt
from llmkit.cli.app import build_app
from llmkit.errors import ConfigError
from llmkit.model.config import ContextExtension, ModelConfig, extended_context
from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe
from tests.train.posttrain_fixtures import addition_rows, write_dataset

pytestmark = pytest.mark.usefixtures("one_thread")
YARN = "{rope_type: yarn, factor: 4, original_max_position_embeddings: 32}"


@pytest.mark.parametrize("scaling, named", [
    ({"rope_type": "ntk", "factor": 4.0}, "rope_scaling.rope_type 'ntk' is not implemented"),
    ({"factor": 4.0}, "rope_scaling.rope_type None is not implemented"),
    ({"rope_type": "linear", "factor": 1.0}, "rope_scaling.factor must be > 1"),
    ({"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 32}, "rope_scaling.factor must be > 1"),
    ({"rope_type": "yarn", "factor": 4.0}, "rope_scaling.original_max_position_embeddings is required for yarn"),
    ({"rope_type": "dynamic", "factor": 4.0}, "rope_scaling.original_max_position_embeddings is required for dynamic"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fats": 8},
     "rope_scaling.beta_fats is not a key of yarn RoPE scaling (did you mean 'beta_fast'?)"),
    ({"rope_type": "yarn", "factor": "4", "original_max_position_embeddings": 32}, "rope_scaling.factor must be a number"),
    ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32.5},
     "rope_scaling.original_max_position_embeddings must be a whole number"),
    ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32, "truncate": 1},
     "rope_scaling.truncate must be true or false"),
    ({"rope_type": "longrope", "factor": 4, "original_max_position_embeddings": 32, "short_factor": [1.0] * 8,
      "long_factor": [1.0] * 7}, "rope_scaling.long_factor must list 8 positive numbers"),
    ("yarn", "rope_scaling must be a mapping"),
])
def test_a_bad_scaling_is_refused_naming_its_key(scaling, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        ModelConfig(hidden_size=64, n_heads=4, n_kv_heads=2, rope_scaling=scaling)


def test_an_extension_reaches_the_original_context_times_the_factor_unless_max_seq_len_is_given():
    base = ModelConfig(max_seq_len=32)
    yarn = {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32}
    assert extended_context(base, ContextExtension(rope_scaling=yarn)).max_seq_len == 128
    assert extended_context(base, ContextExtension(rope_scaling={"rope_type": "linear", "factor": 2})).max_seq_len == 64
    assert extended_context(base, ContextExtension(rope_scaling=yarn, max_seq_len=96)).max_seq_len == 96
    assert extended_context(base, ContextExtension()) is base


def invoke(*args):
    return CliRunner().invoke(build_app(), [str(a) for a in args])


@pytest.mark.parametrize("command", [["pretrain"], ["sft", "--from", "base"]])
@pytest.mark.parametrize("scaling, named", [
    ("{rope_type: ntk, factor: 4}", "model.rope_scaling.rope_type 'ntk' is not implemented"),
    ("{rope_type: linear, factor: 1}", "model.rope_scaling.factor must be > 1"),
    ("{rope_type: yarn, factor: 4}", "model.rope_scaling.original_max_position_embeddings is required"),
])
def test_pretrain_and_sft_exit_2_naming_the_key(tmp_path, command, scaling, named):
    r = invoke(*command, "-w", tmp_path / "ws", "--set", f"model.rope_scaling={scaling}")
    assert r.exit_code == 2, r.output
    assert named in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A tiny random Llama of a 32-token context imported as `base`, a corpus tokenized with its
    tokenizer, and SFT rows."""
    root = tmp_path_factory.mktemp("extend")
    folder, ws = root / "hf", root / "ws"
    backend = train_bpe(QWEN_SPECIALS)
    save_folder(folder, backend, QWEN25_TEMPLATE, eos_token="<|im_end|>")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=backend.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)).save_pretrained(folder)
    assert invoke("import", "--from", folder, "--out", "base", "-w", ws).exit_code == 0
    write_dataset(ws, "corpus", [{"id": f"d{i}", "prompt": f"document {i}: the model reads this text. " * 30}
                                 for i in range(8)])
    write_dataset(ws, "sft_train", addition_rows(8))
    r = invoke("tokenize", "--in", "corpus", "--tokenizer", "base", "-w", ws, "--set", "val_fraction=0")
    assert r.exit_code == 0, r.output
    return ws


TINY = ["--set", "max_steps=1", "--set", "warmup_steps=0", "--set", "micro_batch_size=1", "--set", "eval_every=0"]


def run_config(run) -> dict:
    return json.loads((ckpt.resolve_step_dir(run) / "config.json").read_text())


def test_pretrain_from_a_checkpoint_extends_its_context_with_yarn(workspace, tmp_path):
    ws = workspace
    r = invoke("pretrain", "--from", "base", "--in", "tokens", "--out", "long", "-w", ws, *TINY,
               "--set", "seq_len=128")
    assert r.exit_code == 2 and "exceeds the model's max_seq_len=32" in r.output  # no extension, no room
    extended = ["--set", "seq_len=128", "--set", f"model.rope_scaling={YARN}"]
    r = invoke("pretrain", "--from", "base", "--in", "tokens", "--out", "long", "-w", ws, *TINY, *extended, "--dry-run")
    assert r.exit_code == 0, r.output  # the plan checks seq_len against the extended model, as the run
    r = invoke("pretrain", "--from", "base", "--in", "tokens", "--out", "long", "-w", ws, *TINY, *extended)
    assert r.exit_code == 0, r.output
    config = run_config(ws / "long")
    assert config["rope_scaling"] == {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32}
    assert config["max_seq_len"] == 128
    # export writes it as transformers reads it, and import reads it back
    assert invoke("export", "--from", "long", "--to", tmp_path / "hf", "-w", ws).exit_code == 0
    hf = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert hf.rope_parameters["rope_type"] == "yarn" and hf.rope_parameters["factor"] == 4
    assert invoke("import", "--from", tmp_path / "hf", "--out", "again", "-w", ws).exit_code == 0
    again = run_config(ws / "again")
    assert again["rope_scaling"] == config["rope_scaling"] and again["max_seq_len"] == 128


def test_sft_extends_the_context_of_the_model_it_starts_from(workspace):
    ws = workspace
    args = ["sft", "--from", "base", "--in", "sft_train", "--out", "sft_long", "-w", ws, *TINY, "--set", "seq_len=64",
            "--set", "eval_records=0", "--set", "model.rope_scaling={rope_type: linear, factor: 2}"]
    assert invoke(*args, "--dry-run").exit_code == 0
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    config = run_config(ws / "sft_long")
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2} and config["max_seq_len"] == 64


def test_a_lora_run_that_extended_its_base_loads_with_the_extension(workspace):
    """Its step folders hold adapters and name the base, whose config.json has no scaling."""
    ws = workspace
    r = invoke("sft", "--from", "base", "--in", "sft_train", "--out", "sft_lora_long", "-w", ws, *TINY,
               "--set", "seq_len=64", "--set", "eval_records=0", "--set", "lora.r=4",
               "--set", "model.rope_scaling={rope_type: linear, factor: 2}")
    assert r.exit_code == 0, r.output
    model, _ = llmkit.load(ws / "sft_lora_long")
    assert model.config.rope_scaling == {"rope_type": "linear", "factor": 2} and model.config.max_seq_len == 64
    assert model.rope_cos.shape[0] == 64


def test_distill_refuses_a_context_extension_it_would_not_apply():
    from llmkit.core.config import parse_overrides, resolve_config
    from llmkit.train.distill import DistillConfig

    with pytest.raises(ConfigError, match="distill does not change the student's RoPE"):
        resolve_config(DistillConfig, {}, parse_overrides([f"model.rope_scaling={YARN}"]))
