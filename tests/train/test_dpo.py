import json
import math

import pytest
import torch

from llmkit.config import _Raw
from llmkit.data.chat import collate_pairs, encode_pair
from llmkit.errors import ConfigError
from llmkit.train.dpo import DpoConfig, DpoTask, completion_logps, run_dpo
from llmkit.train.losses import sequence_logps, token_logps
from llmkit.api import load_model
from tests.make_fragments import make_command
from tests.train.posttrain_fixtures import (make_tokenizer, preference_rows, separable_pairs,
                                            tiny_model, write_checkpoint_run, write_dataset)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
def ws(tmp_path, tok):
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "sft", tiny_model(tok.vocab_size), tok)
    write_dataset(ws, "pref_train", separable_pairs(32))
    return ws


def dpo(make_ctx, ws, out="dpo", **overrides):
    settings = dict(max_steps=8, micro_batch_size=8, lr=2e-2, min_lr=2e-3, warmup_steps=1,
                    seq_len=64, log_every=1, eval_every=0, eval_records=8, max_new_tokens=4)
    ctx = make_ctx(inputs=["pref_train"], out=out)
    ctx.overrides = {k: _Raw(str(v)) for k, v in {**settings, **overrides}.items()}
    b = run_dpo(ctx, ctx.config(DpoConfig, "dpo"), base="sft")
    return b, [json.loads(line) for line in (ws / out / "metrics.jsonl").open()]


def test_completion_logps_are_summed_reply_tokens(tok):
    model = tiny_model(tok.vocab_size)
    pairs = [encode_pair(tok, row, 64) for row in preference_rows(3)]
    batch = {k: torch.from_numpy(v) for k, v in collate_pairs(pairs, tok.pad_id).items()}
    logits = model(batch["input_ids"])
    torch.testing.assert_close(completion_logps(model, batch),
                               sequence_logps(logits, batch["labels"]))
    torch.testing.assert_close(completion_logps(model, batch, average=True),
                               sequence_logps(logits, batch["labels"], average=True))


def test_rpo_adds_the_chosen_replies_nll_per_token(tok):
    model = tiny_model(tok.vocab_size)
    pairs = [encode_pair(tok, row, 64) for row in preference_rows(3)]
    batch = {k: torch.from_numpy(v) for k, v in collate_pairs(pairs, tok.pad_id).items()}
    plain, _ = DpoTask(model, None, None, DpoConfig(loss_type="reference_free")).loss(model, batch)
    rpo, _ = DpoTask(model, None, None, DpoConfig(loss_type="reference_free", rpo_alpha=0.5)).loss(model, batch)
    logps, mask = token_logps(model(batch["input_ids"]), batch["labels"])
    chosen = mask[:3]
    nll = -(logps[:3][chosen].sum() / chosen.sum())
    torch.testing.assert_close(rpo, plain + 0.5 * nll)
    with pytest.raises(ConfigError, match="rpo_alpha"):
        DpoConfig(rpo_alpha=-1)


def test_first_step_loss_is_ln2_and_margins_grow(make_ctx, ws, tok):
    b, records = dpo(make_ctx, ws)
    assert records[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)  # policy = reference
    assert records[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    assert records[-1]["rewards/margins"] > records[0]["rewards/margins"] + 0.05
    assert records[-1]["rewards/accuracy"] > 0.5 and records[-1]["loss"] < math.log(2)
    assert {"rewards/chosen", "rewards/rejected", "logps/chosen"} <= set(records[0])
    assert 0.0 <= b.stats["base_accuracy"] <= 1.0 and "accuracy" in b.stats
    before = tiny_model(tok.vocab_size)
    after, _ = load_model(ws / "dpo")
    assert all(not torch.equal(p, q) for p, q in zip(before.parameters(), after.parameters()))


def test_ipo_starts_at_one_over_four_beta_squared(make_ctx, ws):
    _, records = dpo(make_ctx, ws, out="ipo", loss_type="ipo", beta=0.5, max_steps=2)
    assert records[0]["loss"] == pytest.approx(1 / (4 * 0.5 ** 2), abs=1e-4)


def test_reference_held_in_memory_gives_the_precomputed_trajectory(make_ctx, ws):
    _, pre = dpo(make_ctx, ws, out="pre", max_steps=3)
    _, live = dpo(make_ctx, ws, out="live", max_steps=3, precompute_ref="false")
    for a, b in zip(pre, live):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
        assert a["rewards/margins"] == pytest.approx(b["rewards/margins"], abs=1e-4)


def test_invalid_dpo_settings_name_the_key():
    with pytest.raises(ConfigError, match="cdpo needs label_smoothing"):
        DpoConfig(loss_type="cdpo")
    with pytest.raises(ConfigError, match="beta must be > 0"):
        DpoConfig(beta=0)
    with pytest.raises(ConfigError, match="label_smoothing must be in"):
        DpoConfig(loss_type="robust", label_smoothing=0.5)


def test_make_fragment_runs_dpo_with_its_reference(tmp_path):
    for name in ("sft", "pref_train", "base"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
    assert make_command(tmp_path, "dpo") == f"llmkit dpo --from sft --in pref_train -w {tmp_path}"
    assert make_command(tmp_path, "dpo", "DPO_REF=base", "DPO_FLAGS=--set loss_type=ipo") == (
        f"llmkit dpo --from sft --in pref_train --ref base -w {tmp_path} --set loss_type=ipo")


def test_zero3_with_accumulation_trains_like_zero0(make_ctx, ws):
    curves = {stage: dpo(make_ctx, ws, out=f"z{stage}", max_steps=2, grad_accum=2, micro_batch_size=4,
                         zero_stage=stage, eval_records=0, warmup_steps=0)[1] for stage in (0, 3)}
    assert curves[3][0]["grad_norm"] == pytest.approx(curves[0][0]["grad_norm"], rel=1e-5)
    assert curves[3][1]["loss"] == pytest.approx(curves[0][1]["loss"], rel=1e-5)


def test_validation_logs_no_perplexity_for_a_preference_loss(make_ctx, ws):
    records = dpo(make_ctx, ws, max_steps=2, eval_every=2, eval_fraction=0.25, eval_records=0)[1]
    assert "val_loss" in records[-1] and not any("val_ppl" in r for r in records)
