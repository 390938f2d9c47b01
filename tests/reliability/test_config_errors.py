"""Configuration mistakes exit with code 2 and a message that says what to do — no traceback,
and nothing is written for the stage that refused."""
import shutil

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit import stages
from llmkit.checkpoints import step_folders as ckpt
from tests.conftest import write_jsonl
from tests.tokenizers.test_sentencepiece import small_corpus
from tests.train.test_pretrain import TINY

CONFIGURED = [c for c in stages.CONFIGURED if c != "generate"]


def llmkit(*args):
    return CliRunner().invoke(build_app(), [str(a) for a in args])


def refused(result, *phrases: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for phrase in phrases:
        assert phrase in result.output, result.output


REQUIRED = {"ingest": ["docs.jsonl"], "export": ["--from", "sft"], "import": ["--from", "hf"],
            "report": ["pretrain"], "extend-vocab": ["--from", "base"], "merge": ["--from", "a,b"],
            "ablate": ["experiment.yaml"]}


@pytest.mark.parametrize("stage", CONFIGURED)
def test_every_stage_names_an_unknown_key(tmp_path, stage):
    refused(llmkit(stage, *REQUIRED.get(stage, []), "-w", tmp_path, "--set", "no_such_key=1"),
            "no_such_key")
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("stage, setting, phrase", [
    ("pretrain", "max_steps=ten", "max_steps"),
    ("pretrain", "micro_batch_size=-4", "micro_batch_size must be >= 1"),
    ("pretrain", "lr=-1", "lr"),
    ("tokenizer", "vocab_size=-5", "vocab_size"),
    ("clean", "min_chars=-1", "min_chars"),
    ("dedup", "method=fuzzy", "method"),
    ("dedup", "minhash.threshold=1.5", "threshold"),
    ("tokenize", "val_fraction=2", "val_fraction"),
    ("sft", "seq_len=0", "seq_len"),
    ("dpo", "beta=-0.1", "beta"),
])
def test_wrong_types_and_out_of_range_values_name_the_key(tmp_path, stage, setting, phrase):
    refused(llmkit(stage, "-w", tmp_path, "--set", setting), phrase)


def test_negative_worker_count_is_refused(tmp_path):
    docs = write_jsonl(tmp_path / "d.jsonl", [{"text": "hello world"}])
    refused(llmkit("ingest", docs, "-w", tmp_path / "ws", "--workers", "-1"), "--workers")


def test_a_missing_input_names_it_and_the_stage_that_makes_it(tmp_path):
    refused(llmkit("clean", "-w", tmp_path), "no artifact 'raw'", "llmkit ingest")
    refused(llmkit("sft", "--from", "pretrain", "-w", tmp_path), "no artifact 'pretrain'",
            "llmkit pretrain")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A workspace with a tokenizer, its tokens, and a 2-step pretrain run on them."""
    tmp = tmp_path_factory.mktemp("cfg")
    ws = tmp / "ws"
    rows = [{"id": f"d{i}", "text": t} for i, t in enumerate(small_corpus(120))]
    assert llmkit("ingest", write_jsonl(tmp / "docs.jsonl", rows), "-w", ws, "--out", "dedup").exit_code == 0
    assert llmkit("tokenizer", "-w", ws, "--in", "dedup", "--set", "vocab_size=400").exit_code == 0
    assert llmkit("tokenize", "-w", ws, "--in", "dedup").exit_code == 0
    sets = [a for s in (*TINY, "max_steps=2", "eval_every=0") for a in ("--set", s)]
    result = llmkit("pretrain", "-w", ws, *sets)
    assert result.exit_code == 0, result.output
    return ws


def test_continued_pretraining_on_tokens_of_another_tokenizer_is_refused(tmp_path, trained):
    ws = tmp_path / "ws"
    shutil.copytree(trained, ws)
    assert llmkit("tokenizer", "-w", ws, "--in", "dedup", "--out", "tok520",
                  "--set", "vocab_size=520").exit_code == 0
    assert llmkit("tokenize", "-w", ws, "--in", "dedup", "--tokenizer", "tok520",
                  "--out", "tokens520").exit_code == 0
    sets = [a for s in (*TINY, "max_steps=2") for a in ("--set", s)]
    refused(llmkit("pretrain", "-w", ws, "--from", "pretrain", "--in", "tokens520", "--out", "more",
                   *sets), "another tokenizer", "tokenize the corpus with that tokenizer")
    assert not (ws / "more" / "manifest.json").exists()


def test_from_an_interrupted_run_says_to_rerun_it(tmp_path, trained):
    ws = tmp_path / "ws"
    shutil.copytree(trained, ws)
    (ws / "pretrain" / "manifest.json").unlink()  # the run was killed ...
    for step in ckpt.step_dirs(ws / "pretrain"):   # ... before any save completed
        (step / ckpt.COMPLETE).unlink()
    for name in ("pretrain", ws / "pretrain"):
        refused(llmkit("sft", "-w", ws, "--from", name, "--in", "dedup"), "pretrain has no manifest.json",
                "incomplete", "Re-run the stage that builds it")
