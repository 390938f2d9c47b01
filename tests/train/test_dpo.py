import json
import math
from types import SimpleNamespace

import pytest
import torch

from llmkit.core.config import parse_overrides
from llmkit.data.preferences import collate_pairs, encode_pair
from llmkit.errors import ConfigError
from llmkit.model import packed_linear
from llmkit.train.cpu_precision import missing_cpu_bf16
from llmkit.train.dpo import (DpoConfig, DpoTask, completion_logps, precompute_reference_logps,
                              run_dpo)
from llmkit.checkpoints.loading import load_model
from llmkit.train.losses import token_logps
from tests.train.reference_losses import sequence_logps
from tests.make_fragments import make_command
from tests.train.posttrain_fixtures import (constant_model, preference_rows, separable_pairs,
                                            tiny_model, write_checkpoint_run, write_dataset)


@pytest.fixture
def ws(tmp_path, tok):
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "sft", tiny_model(tok.vocab_size), tok)
    write_dataset(ws, "pref_train", separable_pairs(32))
    return ws


def dpo(make_ctx, ws, out="dpo", ref=None, **overrides):
    settings = dict(max_steps=8, micro_batch_size=8, lr=2e-2, min_lr=2e-3, warmup_steps=1,
                    seq_len=64, log_every=1, eval_every=0, eval_records=8, max_new_tokens=4)
    ctx = make_ctx(inputs=["pref_train"], out=out)
    ctx.overrides = parse_overrides([f"{k}={v}" for k, v in {**settings, **overrides}.items()])
    b = run_dpo(ctx, ctx.config(DpoConfig, "dpo"), base="sft", ref=ref)
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
    assert b.stats["base_accuracy"] == 0.0 and "accuracy" in b.stats  # an untrained model does not add up
    before = tiny_model(tok.vocab_size)
    after, _ = load_model(ws / "dpo")
    assert all(not torch.equal(p, q) for p, q in zip(before.parameters(), after.parameters()))


def test_ipo_starts_at_one_over_four_beta_squared(make_ctx, ws):
    _, records = dpo(make_ctx, ws, out="ipo", loss_type="ipo", beta=0.5, max_steps=2)
    assert records[0]["loss"] == pytest.approx(1 / (4 * 0.5 ** 2), abs=1e-4)


def test_ipo_averages_reply_log_probs_against_a_different_reference(tok):
    """Policy = reference gives 1/(4β²) whatever IPO does with log-probs; here they differ, and
    chosen and rejected replies differ in length, so only the per-token mean gives this loss."""
    policy, reference = tiny_model(tok.vocab_size, seed=0), tiny_model(tok.vocab_size, seed=1).eval()
    pairs = [encode_pair(tok, row, 64) for row in separable_pairs(4)]
    batch = {k: torch.from_numpy(v) for k, v in collate_pairs(pairs, tok.pad_id).items()}
    beta = 0.5

    def ipo_by_hand(average: bool):
        with torch.no_grad():
            (pi, n), (ref, _) = [(lp.sum(-1), mask.sum(-1)) for lp, mask in
                                 (token_logps(m(batch["input_ids"]), batch["labels"]) for m in (policy, reference))]
        if average:
            pi, ref = pi / n, ref / n
        h = (pi[:4] - pi[4:]) - (ref[:4] - ref[4:])
        return ((h - 1 / (2 * beta)) ** 2).mean()

    by_hand = ipo_by_hand(average=True)
    assert abs(by_hand - ipo_by_hand(average=False)) > 0.05  # summing gives another loss
    cfg = DpoConfig(loss_type="ipo", beta=beta, precompute_ref=False)
    live = DpoTask(policy, None, None, cfg, reference)
    live.device = torch.device("cpu")
    torch.testing.assert_close(live.loss(policy, batch)[0].detach(), by_hand)
    precompute_reference_logps(reference, pairs, tok.pad_id, 8, cfg.average_logps)
    stored = {k: torch.from_numpy(v) for k, v in collate_pairs(pairs, tok.pad_id).items()}
    torch.testing.assert_close(DpoTask(policy, None, None, cfg).loss(policy, stored)[0].detach(), by_hand)


def test_reference_held_in_memory_gives_the_precomputed_trajectory(make_ctx, ws):
    _, pre = dpo(make_ctx, ws, out="pre", max_steps=3)
    _, live = dpo(make_ctx, ws, out="live", max_steps=3, precompute_ref="false")
    for a, b in zip(pre, live):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
        assert a["rewards/margins"] == pytest.approx(b["rewards/margins"], abs=1e-4)


@pytest.mark.parametrize("precompute", [True, False])
def test_ref_run_is_the_reference_whose_log_probs_the_rewards_use(make_ctx, ws, tok, precompute):
    """--ref uniform: a model whose logits are all 0, so every reply token has log-prob −log V and
    each chosen reply (3 labelled tokens here) −3·log V; rewards/chosen = β·(log π_c − that)."""
    write_checkpoint_run(ws, "uniform", constant_model(tok.vocab_size), tok)
    settings = dict(max_steps=1, eval_records=0, precompute_ref=str(precompute).lower())
    _, own = dpo(make_ctx, ws, out="own", **settings)
    _, other = dpo(make_ctx, ws, out="other", ref="uniform", **settings)
    assert own[0]["rewards/chosen"] == pytest.approx(0.0, abs=1e-6)  # reference = policy
    assert other[0]["logps/chosen"] == pytest.approx(own[0]["logps/chosen"], abs=1e-5)  # same policy
    uniform_logp = -3 * math.log(tok.vocab_size)
    assert other[0]["rewards/chosen"] == pytest.approx(0.1 * (other[0]["logps/chosen"] - uniform_logp),
                                                       rel=1e-4)
    assert abs(other[0]["loss"] - math.log(2)) > 1e-4 and abs(own[0]["loss"] - math.log(2)) < 1e-5
    manifest = json.loads((ws / "other" / "manifest.json").read_text())
    assert any(i["path"].endswith("uniform") for i in manifest["inputs"])


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


@pytest.mark.parametrize("precompute", [True, False])
def test_in_bf16_the_reference_is_the_policy_at_step_0(make_ctx, ws, precompute):
    """The reference's log-probs are computed in the dtype the policy trains in: at the first
    step log π − log π_ref is 0 for every pair (in fp32 it would be the bf16 rounding of the
    weights, 0.004–0.008 nats a sequence on this tiny model)."""
    _, records = dpo(make_ctx, ws, precision="bf16", max_steps=1, precompute_ref=precompute)
    assert records[0]["rewards/chosen"] == 0.0 and records[0]["rewards/rejected"] == 0.0
    assert records[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)


@pytest.mark.skipif(missing_cpu_bf16() is not None, reason="needs a CPU that multiplies bf16")
@pytest.mark.parametrize("precompute", [True, False])
def test_on_a_bf16_lora_base_the_reference_is_the_policy_at_step_0(make_ctx, ws, monkeypatch, precompute):
    """The reference passes multiply as the training passes do (`lora.base_products`, precomputed
    before the run too) and take their ops (`cpu_kernels.training_ops`): bf16 products would make
    any last-bit difference a visible one."""
    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 1)  # the tiny model's base packed as SmolLM2's
    b, records = dpo(make_ctx, ws, max_steps=1, precompute_ref=precompute,
                     **{"lora.r": 4, "lora.base_products": "bf16"})
    assert b.stats["base_products"] == "bf16"
    assert records[0]["rewards/chosen"] == 0.0 and records[0]["rewards/rejected"] == 0.0


@pytest.mark.parametrize("loss_type", ["orpo", "simpo"])
def test_orpo_and_simpo_train_without_loading_or_scoring_a_reference(make_ctx, ws, tok, monkeypatch,
                                                                     loss_type):
    import llmkit.train.dpo as dpo_module

    def no_reference(*_, **__):
        raise AssertionError("a reference model was loaded, copied or scored")

    for name in ("load_model", "precompute_reference_logps", "adapters_disabled"):
        monkeypatch.setattr(dpo_module, name, no_reference)
    monkeypatch.setattr(dpo_module, "copy", SimpleNamespace(deepcopy=no_reference))
    beta = 2.0 if loss_type == "simpo" else 0.5
    b, records = dpo(make_ctx, ws, out=loss_type, loss_type=loss_type, beta=beta)
    assert b.stats["reference_seconds"] == 0.0
    assert records[-1]["rewards/margins"] > records[0]["rewards/margins"] + 0.05
    assert records[-1]["loss"] < records[0]["loss"]
    assert ("nll" in records[0]) == (loss_type == "orpo")  # ORPO's SFT term; SimPO's cpo_alpha is 0
    before = tiny_model(tok.vocab_size)
    after, _ = load_model(ws / loss_type)
    assert all(not torch.equal(p, q) for p, q in zip(before.parameters(), after.parameters()))


def test_a_reference_run_under_orpo_is_refused_by_name(make_ctx, ws, tok):
    write_checkpoint_run(ws, "uniform", constant_model(tok.vocab_size), tok)
    with pytest.raises(ConfigError, match="--ref uniform: loss_type=orpo uses no reference model"):
        dpo(make_ctx, ws, out="orpo_ref", ref="uniform", loss_type="orpo")
    assert not (ws / "orpo_ref").exists()
