import json

import pytest
import torch

from llmkit.core.config import _Raw
from llmkit.errors import UserError
from llmkit.checkpoints.loading import load_reward_model
from llmkit.model.reward_model import RewardModel
from llmkit.train.rm import RmConfig, run_rm
from tests.make_fragments import make_command
from tests.train.posttrain_fixtures import (separable_pairs, tiny_model, write_checkpoint_run,
                                            write_dataset)


def reward_model(vocab_size, seed=0) -> RewardModel:
    torch.manual_seed(seed)
    return RewardModel(tiny_model(vocab_size, seed=seed)).eval()


def test_reward_is_read_at_the_last_real_token_whatever_the_padding(tok):
    rm = reward_model(tok.vocab_size)
    ids = torch.randint(4, tok.vocab_size, (1, 9))
    alone = rm(ids, torch.ones_like(ids))
    right = torch.cat([ids, torch.full((1, 3), 7)], 1)
    right_mask = torch.tensor([[1] * 9 + [0] * 3])
    left = torch.cat([torch.full((1, 3), 7), ids], 1)
    left_mask = torch.tensor([[0] * 3 + [1] * 9])
    torch.testing.assert_close(rm(right, right_mask), alone)
    torch.testing.assert_close(rm(left, left_mask), alone, atol=1e-5, rtol=1e-5)
    shorter = rm(ids[:, :8], torch.ones(1, 8, dtype=torch.long))
    assert not torch.allclose(shorter, alone)  # the last token matters
    batch = rm(torch.cat([right, left]), torch.cat([right_mask, left_mask]))
    assert batch.shape == (2,)


def test_parameter_names_are_llama_sequence_classification_names(tok):
    names = list(reward_model(tok.vocab_size).state_dict())
    assert names[-1] == "score.weight" and "model.embed_tokens.weight" in names
    assert all(n.startswith("model.") for n in names[:-1])  # no lm_head, no wrapper prefix


def test_a_saved_reward_model_loads_back_in_eval_mode(tok, tmp_path):
    rm = reward_model(tok.vocab_size, seed=3)
    run = write_checkpoint_run(tmp_path, "rm", rm, tok, config=rm.checkpoint_config())
    loaded = load_reward_model(run)
    assert not loaded.training
    ids = torch.randint(4, tok.vocab_size, (2, 6))
    torch.testing.assert_close(loaded(ids, torch.ones_like(ids)), rm(ids, torch.ones_like(ids)))
    policy = write_checkpoint_run(tmp_path, "policy", tiny_model(tok.vocab_size), tok)
    with pytest.raises(UserError, match="is not a reward model"):
        load_reward_model(policy)


def test_rm_run_raises_pairwise_accuracy(make_ctx, tmp_path, tok, monkeypatch):
    started = []  # the reward model's weights as run_rm builds it (its score head is random)
    build = RewardModel.__init__

    def remember_start(self, trunk):
        build(self, trunk)
        started.append({k: v.detach().clone() for k, v in self.state_dict().items()})

    monkeypatch.setattr(RewardModel, "__init__", remember_start)
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "sft", tiny_model(tok.vocab_size), tok)
    write_dataset(ws, "pref_train", separable_pairs(64))
    write_dataset(ws, "pref_eval", separable_pairs(16, seed=1))
    ctx = make_ctx(inputs=["pref_train"])
    ctx.overrides = {k: _Raw(str(v)) for k, v in dict(
        max_steps=15, micro_batch_size=8, lr=1e-2, min_lr=1e-3, warmup_steps=2, seq_len=64,
        log_every=1, eval_every=15, center_coef=0.01).items()}
    b = run_rm(ctx, ctx.config(RmConfig, "rm"), base="sft", eval_data="pref_eval")
    records = [json.loads(line) for line in (ws / "rm" / "metrics.jsonl").open()]
    assert {"accuracy", "rewards/chosen", "rewards/rejected", "rewards/margins"} <= set(records[0])
    assert records[-1]["loss"] < 0.5 * records[0]["loss"]
    evaluated = [r for r in records if "val_loss" in r]
    assert evaluated and "val_accuracy" in evaluated[-1]
    assert not any("val_ppl" in r for r in records)  # exp of a Bradley–Terry loss means nothing
    assert records[-1]["rewards/margins"] > records[0]["rewards/margins"] + 1
    assert b.stats["heldout_pairs"] == 16
    assert b.stats["base_accuracy"] < 0.8 and b.stats["accuracy"] >= 0.9  # held-out pairs
    config = json.loads(next((ws / "rm").glob("step-*/config.json")).read_text())
    assert config["llmkit_head"] == "reward"
    trained = load_reward_model(ws / "rm").state_dict()
    assert started[0].keys() == trained.keys()  # every parameter trains: no lm_head in a reward model
    unchanged = [k for k, v in started[0].items() if torch.equal(v, trained[k])]
    assert not unchanged, unchanged


def test_make_fragment_runs_rm_on_its_inputs(tmp_path):
    for name in ("sft", "pref_train", "pref_eval"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
    assert make_command(tmp_path, "rm", "RM_EVAL=pref_eval") == (
        f"llmkit rm --from sft --in pref_train --eval pref_eval -w {tmp_path}")


def test_zero3_with_accumulation_trains_like_zero0(make_ctx, tmp_path, tok):
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "sft", tiny_model(tok.vocab_size), tok)
    write_dataset(ws, "pref_train", separable_pairs(32))
    curves = {}
    for stage in (0, 3):
        ctx = make_ctx(inputs=["pref_train"], out=f"z{stage}")
        ctx.overrides = {k: _Raw(str(v)) for k, v in dict(
            max_steps=2, grad_accum=2, micro_batch_size=4, lr=1e-2, warmup_steps=0, seq_len=64,
            log_every=1, eval_every=0, zero_stage=stage).items()}
        run_rm(ctx, ctx.config(RmConfig, "rm"), base="sft")
        curves[stage] = [json.loads(line) for line in (ws / f"z{stage}" / "metrics.jsonl").open()]
    assert curves[3][0]["grad_norm"] == pytest.approx(curves[0][0]["grad_norm"], rel=1e-5)
    assert curves[3][1]["loss"] == pytest.approx(curves[0][1]["loss"], rel=1e-5)
