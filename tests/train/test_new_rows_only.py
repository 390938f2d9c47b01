import json

import pytest
import torch

from llmkit.checkpoints import step_folders as ckpt
from llmkit.checkpoints.new_rows import write_extension
from llmkit.train.metrics import read_metrics
from tests.train.test_pretrain import pretrain, token_workspace

VOCAB = 400  # token_workspace's tokenizer
NEW = list(range(300, VOCAB))  # the rows this test calls added (extend-vocab appends its pieces)


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return token_workspace(tmp_path_factory.mktemp("new_rows"))


def extended_base(ws, name: str, *settings) -> None:
    """A tiny trained run whose tokenizer names rows 300-399 as extend-vocab's."""
    pretrain(ws, "max_steps=2", "eval_every=0", *settings, extra=["--out", name])
    write_extension(ckpt.resolve_step_dir(ws / name) / ckpt.TOKENIZER, NEW, vocab_before=NEW[0])


@pytest.mark.parametrize("tied", [True, False])
def test_only_the_added_rows_train_and_every_other_weight_stays_bit_for_bit(ws, tied):
    base, rows = f"base-{tied}", f"rows-{tied}"
    extended_base(ws, base, f"model.tie_embeddings={str(tied).lower()}")
    pretrain(ws, "max_steps=6", "eval_every=0", "train_only=new_rows", "weight_decay=0.5", "lr=5e-2",
             extra=["--from", base, "--out", rows])
    before, _ = ckpt.load_weights(ws / base)
    after, _ = ckpt.load_weights(ws / rows)
    assert before.keys() == after.keys()
    matrices = ["model.embed_tokens.weight", "lm_head.weight"]  # tied: one matrix under both names
    for name in before:
        if name in matrices:
            assert torch.equal(after[name][:NEW[0]], before[name][:NEW[0]]), name
        else:
            assert torch.equal(after[name], before[name]), name
    assert torch.equal(after["lm_head.weight"], after["model.embed_tokens.weight"]) == tied
    head = after["lm_head.weight"][NEW[0]:] != before["lm_head.weight"][NEW[0]:]
    assert head.any(dim=1).all()  # the head scores every row: every new row learned
    losses = [r["loss"] for r in read_metrics(ws / rows)]
    assert losses[-1] < losses[0]
    assert json.loads((ws / rows / "manifest.json").read_text())["config"]["train_only"] == "new_rows"


def test_a_start_without_added_rows_exits_2_naming_the_setting(ws):
    pretrain(ws, "max_steps=2", "eval_every=0", extra=["--out", "plain"])
    r = pretrain(ws, "max_steps=2", "train_only=new_rows", expect=2, extra=["--from", "plain", "--out", "x"])
    assert "train_only=new_rows" in r.output and "extension.json" in r.output and "Traceback" not in r.output
    r = pretrain(ws, "max_steps=2", "train_only=new_rows", expect=2, extra=["--out", "y"])
    assert "train_only=new_rows" in r.output and "--from" in r.output
    assert "train_only must be one of all, new_rows" in pretrain(ws, "train_only=rows", expect=2).output
