"""GRPO's loss variants (llmkit.train.grpo_losses) against TRL 1.16's GRPOTrainer._compute_loss on
the same per-token log-probs, advantages and masks: for every loss_type and importance sampling
level, the loss and its gradient w.r.t. the log-probs agree to 1e-5 (relative to their largest
entry); planted defects in the variants fail the same comparison. The aggregation's hand-computed
cases follow."""

from types import SimpleNamespace

import pytest
import torch

import llmkit.train.grpo_losses as grpo_losses
import llmkit.train.ppo_algorithms as ppo_algorithms
from llmkit.errors import ConfigError
from llmkit.train.grpo_losses import (GRPO_LOSS_TYPES, aggregate_token_loss, grpo_token_loss,
                                      log_importance_weights, vespo_weights)
from llmkit.train.ppo_config import PpoConfig
from llmkit.train.rl_losses import clipped_policy_loss, clipped_policy_token_loss
from llmkit.train.task import ITEMS_PER_MICRO_BATCH
from tests.train.test_trl_parity import ACCUM, MAX_NEW_TOKENS, grpo, hf_tokenizer, tokenizer_folder  # noqa: F401 (fixtures)

REL = 1e-5
B, R = 6, 7
OTHER_TOKENS = 9  # the response tokens of the step's other micro-batch (dapo, cispo, vespo's normaliser)


def minibatch(seed: int = 0) -> SimpleNamespace:
    """Responses of 1..R tokens, log-probs a policy could give, an old policy off by enough to
    clip (and to push VESPO's weights well away from 1), a reference, advantages of both signs
    and one 0 (a group whose scores were all alike)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 1, 4, 6, 2, 5])
    mask = (torch.arange(R)[None] < lengths[:, None]).long()
    logps = -2 * torch.rand(B, R, generator=g, dtype=torch.float64) - 0.05
    advantages = torch.tensor([0.8, -0.9, 1.1, 0.0, 0.4, -0.6], dtype=torch.float64)
    return SimpleNamespace(mask=mask, logps=logps, advantages=advantages,
                           old=logps + 0.35 * torch.randn(B, R, generator=g, dtype=torch.float64),
                           ref=logps + 0.3 * torch.randn(B, R, generator=g, dtype=torch.float64))


def trls_loss(trainer, monkeypatch, setting: dict, mb) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, its gradient w.r.t. the log-probs) of GRPOTrainer._compute_loss, its forward stood
    in for by the given per-token log-probs: one micro-batch of a step of ACCUM (the other one
    holding OTHER_TOKENS response tokens)."""
    logps = mb.logps.clone().requires_grad_()
    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies",
                        lambda *a, **k: (logps, torch.zeros_like(logps), None))
    for name, value in dict(loss_type=setting["loss_type"], beta=setting["beta"], epsilon_low=setting["epsilon"],
                            epsilon_high=setting["epsilon_high"] or setting["epsilon"],
                            importance_sampling_level=setting["level"], entropy_coef=0.0,
                            _entropy_bonus_enabled=False, current_gradient_accumulation_steps=ACCUM).items():
        monkeypatch.setattr(trainer, name, value, raising=False)
    for name in ("delta", "use_bias_correction_kl", "sapo_temperature_pos", "sapo_temperature_neg",
                 "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
        monkeypatch.setattr(trainer.args, name, setting[name])
    trainer.model.train()
    prompt = torch.ones(B, 2, dtype=torch.long)
    inputs = {"prompt_ids": prompt, "prompt_mask": prompt, "completion_ids": torch.ones(B, R, dtype=torch.long),
              "completion_mask": mb.mask, "advantages": mb.advantages, "old_per_token_logps": mb.old,
              "ref_per_token_logps": mb.ref, "num_items_in_batch": mb.mask.sum() + OTHER_TOKENS}
    loss = trainer._compute_loss(trainer.model, inputs)
    return loss.detach(), torch.autograd.grad(loss, logps)[0]


def ours(setting: dict, mb) -> tuple[torch.Tensor, torch.Tensor]:
    """llmkit's algorithm_loss on the same minibatch, over grad_accum as the engine backpropagates
    it; the step's response tokens per micro-batch as the engine gives them (ITEMS_PER_MICRO_BATCH)."""
    cfg = PpoConfig(algo="grpo", loss_type=setting["loss_type"], kl_coef=setting["beta"],
                    clip_range=setting["epsilon"], clip_range_high=setting["epsilon_high"],
                    importance_sampling_level=setting["level"], ratio_max=setting["delta"],
                    kl_bias_correction=setting["use_bias_correction_kl"],
                    **{k: setting[k] for k in ("sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos",
                                               "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")},
                    max_new_tokens=MAX_NEW_TOKENS, group_size=B, prompts_per_rollout=ACCUM, micro_batch_size=B, grad_accum=ACCUM)
    logps = mb.logps.clone().requires_grad_()
    batch = {"response_mask": mb.mask, "advantages": mb.advantages[:, None] * mb.mask,
             ITEMS_PER_MICRO_BATCH: (mb.mask.sum() + OTHER_TOKENS).double() / ACCUM}
    if setting["beta"]:
        batch["ref_logprobs"] = mb.ref
    loss, metrics = ppo_algorithms.algorithm_loss(cfg, batch, logps, mb.old, None, setting["beta"])
    if "clipfrac" in metrics:  # the clip (cispo's cap) is active on some tokens or responses, not all
        assert 0 < metrics["clipfrac"] < 1, setting
    loss = loss / ACCUM
    return loss.detach(), torch.autograd.grad(loss, logps)[0]


DEFAULTS = dict(beta=0.04, epsilon=0.2, epsilon_high=None, level="token", delta=None, use_bias_correction_kl=False,
                sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, vespo_k_pos=2.0, vespo_lambda_pos=3.0,
                vespo_k_neg=3.0, vespo_lambda_neg=2.0)
CASES = {f"{loss_type}, {level}": dict(loss_type=loss_type, level=level)
         for loss_type in GRPO_LOSS_TYPES for level in ("token", "sequence") if (loss_type, level) != ("vespo", "sequence")}
for case in CASES.values():
    if case["loss_type"] == "cispo":
        # a cap some weights exceed (llmkit asks for one: TRL's default is ε)
        case["epsilon_high"] = 1.3 if case["level"] == "token" else 1.2
CASES.update({
    "gspo (grpo, sequence), bias-corrected KL": dict(loss_type="grpo", level="sequence", use_bias_correction_kl=True),
    "dapo, bias-corrected KL, beta=0": dict(loss_type="dapo", beta=0.0, use_bias_correction_kl=True),
    "dapo, two-sided clip (delta)": dict(loss_type="dapo", delta=1.25, epsilon_high=0.1),
    "cispo, TRL's default cap epsilon_high = epsilon": dict(loss_type="cispo", epsilon_high=0.2),
    "sapo, own temperatures": dict(loss_type="sapo", sapo_temperature_pos=2.0, sapo_temperature_neg=0.5),
    "vespo, own k and lambda": dict(loss_type="vespo", vespo_k_pos=1.0, vespo_lambda_pos=1.5, vespo_k_neg=4.0,
                                    vespo_lambda_neg=0.7),
})


def parity_gap(trainer, monkeypatch, case: str) -> tuple[float, float]:
    """(max |ours − TRL's| of the loss, of its gradient), each relative to TRL's largest entry."""
    setting = {**DEFAULTS, **CASES[case]}
    theirs, our = trls_loss(trainer, monkeypatch, setting, minibatch()), ours(setting, minibatch())
    assert theirs[1].abs().max() > 0
    return tuple(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(our, theirs))


@pytest.mark.parametrize("case", list(CASES))
def test_each_loss_and_its_gradient_equal_trls_on_the_same_log_probs(grpo, monkeypatch, case):
    loss_gap, grad_gap = parity_gap(grpo, monkeypatch, case)
    assert loss_gap <= REL and grad_gap <= REL, (loss_gap, grad_gap)


def cispo_not_detached(logprobs, old, advantages, mask, loss_type, **settings):
    ratio = torch.exp(logprobs - old)
    return -ratio.clamp(max=settings["clip_range_high"]) * advantages * logprobs, ratio, None


def summed_log_ratio(logprobs, old, mask, level="token"):
    return ((logprobs - old) * mask).sum(-1, keepdim=True)  # Σ over the tokens, not their mean


def sapo_temperatures_swapped(*args, sapo_temperatures, **settings):
    return grpo_token_loss(*args, sapo_temperatures=sapo_temperatures[::-1], **settings)


def vespo_through_phi(logprobs, old, advantages, mask, loss_type, **settings):
    phi = vespo_weights.__wrapped__(advantages, logprobs - old, mask, *settings["vespo"])
    return -phi * advantages * logprobs, None, None


def with_setting(fn, **changed):
    return lambda *a, **k: fn(*a, **{**k, **changed})


DEFECTS = {  # a planted defect -> (the case it breaks, the module, the name replaced, by what)
    "cispo's weight not detached": ("cispo, token", ppo_algorithms, "grpo_token_loss", cispo_not_detached),
    "cispo capped at 1 + epsilon_high": ("cispo, token", ppo_algorithms, "grpo_token_loss",
                                         with_setting(grpo_token_loss, clip_range_high=2.3)),
    "gspo's sequence ratio a sum": ("grpo, sequence", grpo_losses, "log_importance_weights", summed_log_ratio),
    "gspo's level ignored": ("grpo, sequence", ppo_algorithms, "grpo_token_loss", with_setting(grpo_token_loss, level="token")),
    "sapo's temperatures swapped": ("sapo, own temperatures", ppo_algorithms, "grpo_token_loss", sapo_temperatures_swapped),
    "vespo's weight differentiated": ("vespo, token", ppo_algorithms, "grpo_token_loss", vespo_through_phi),
    "luspo averaged per sequence": ("luspo, sequence", ppo_algorithms, "aggregate_token_loss",
                                    with_setting(aggregate_token_loss, loss_type="grpo")),
    "cispo normalised per micro-batch": ("cispo, token", ppo_algorithms, "aggregate_token_loss",
                                         with_setting(aggregate_token_loss, loss_type="bnpo")),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_a_planted_defect_fails_the_parity(grpo, monkeypatch, defect):
    case, module, name, replacement = DEFECTS[defect]
    monkeypatch.setattr(module, name, replacement)
    assert max(parity_gap(grpo, monkeypatch, case)) > 1e-3


# ---- the variants against hand-computed cases ----------------------------------------------------

def test_gspo_weighs_a_response_by_the_exp_of_its_mean_token_log_ratio():
    logp, old = torch.tensor([[0.0, -1.0, -2.0]]), torch.tensor([[-0.3, -0.7, -5.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert log_importance_weights(logp, old, mask, "sequence").item() == pytest.approx((0.3 - 0.3) / 2)
    per_token, ratio, _ = grpo_token_loss(logp, old, torch.tensor([[2.0]]), mask, "grpo", level="sequence")
    assert ratio.shape == (1, 1) and per_token.tolist() == [[-2.0]]


def test_cispo_keeps_a_gradient_on_every_token_the_clip_would_silence():
    """PPO's clip gives a token whose ratio left [1 − ε, 1 + ε] no gradient; CISPO's weight is
    capped and detached, so the token still gets −w·A·∇log π."""
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.0, 0.0]])  # ρ = e and 1
    adv, mask = torch.tensor([[1.0]]), torch.ones(1, 2)
    clipped, _ = clipped_policy_token_loss(logp, old, adv, 0.2)
    assert torch.autograd.grad(clipped.sum(), logp)[0][0].tolist() == pytest.approx([0.0, -1.0])
    cispo, _, was_clipped = grpo_token_loss(logp, old, adv, mask, "cispo", clip_range_high=2.0)
    assert torch.autograd.grad(cispo.sum(), logp)[0][0].tolist() == pytest.approx([-2.0, -1.0])
    assert was_clipped.tolist() == [[True, False]]


def test_sapo_is_the_surrogate_on_policy_and_fades_off_policy():
    adv, mask = torch.tensor([[1.0], [-1.0]]), torch.ones(2, 3)
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.0, 2.0, -2.0], [0.0, 2.0, -2.0]], requires_grad=True)
    per_token, _, _ = grpo_token_loss(logp, old, adv, mask, "sapo")
    grad = torch.autograd.grad(per_token.sum(), logp)[0]
    assert grad[:, 0].tolist() == pytest.approx([-1.0, 1.0])  # ρ = 1: −A, as the surrogate's
    assert (grad[:, 1:].abs() < 0.5).all()  # far from ρ = 1 the gate closes, softly


# ---- the aggregation (TRL's loss_type) -----------------------------------------------------------

def test_aggregate_token_loss_types_equal_their_hand_computation():
    per_token = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    total = 1 + 2 + 3 + 4 + 5 + 6
    assert aggregate_token_loss(per_token, mask, "grpo").item() == pytest.approx((10 / 4 + 11 / 2) / 2)
    assert aggregate_token_loss(per_token, mask, "bnpo").item() == pytest.approx(total / 6)
    assert aggregate_token_loss(per_token, mask, "dr_grpo", max_tokens=8).item() == pytest.approx(total / (2 * 8))
    assert aggregate_token_loss(per_token, mask, "dapo", tokens_per_micro_batch=7.0).item() == pytest.approx(total / 7)
    padded = per_token.masked_fill(mask == 0, 100.0)  # padding never counts
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        got = aggregate_token_loss(padded, mask, loss_type, max_tokens=8, tokens_per_micro_batch=7.0)
        want = aggregate_token_loss(per_token, mask, loss_type, max_tokens=8, tokens_per_micro_batch=7.0)
        assert got.item() == pytest.approx(want.item())
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate_token_loss(per_token, mask, "dr_grpo")
    assert aggregate_token_loss(per_token, mask, "luspo").item() == pytest.approx((10 + 11) / 2)
    assert aggregate_token_loss(per_token, mask, "sapo").item() == aggregate_token_loss(per_token, mask, "grpo").item()
    with pytest.raises(ValueError, match="'grpo', 'bnpo', 'dr_grpo', 'dapo'"):
        aggregate_token_loss(per_token, mask, "seq_mean")


def test_a_short_good_sample_and_a_long_bad_one_cancel_per_sequence_not_per_token():
    """Issue 17's example: advantage +1 on a 1-token response, −1 on a 5-token one. The paper's
    per-sequence mean ("grpo") weighs the two samples alike, so the surrogate objective is 0; the
    token mean llmkit used (TRL's "bnpo") lets the long one outvote it: (1 − 5) / 6 = −0.67."""
    mask = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    advantages = torch.tensor([[1.0], [-1.0]]).expand(2, 5) * mask
    logprobs = torch.zeros(2, 5)  # on-policy: ρ = 1, the per-token loss is −A
    per_token, _ = clipped_policy_token_loss(logprobs, logprobs, advantages, clip_range=0.2)
    objective = {t: -aggregate_token_loss(per_token, mask, t, max_tokens=5, tokens_per_micro_batch=6.0).item()
                 for t in ("grpo", "bnpo", "dr_grpo", "dapo")}
    assert objective["grpo"] == pytest.approx(0.0)
    assert objective["bnpo"] == pytest.approx(-4 / 6) and round(objective["bnpo"], 2) == -0.67
    old_token_mean, _ = clipped_policy_loss(logprobs, logprobs, advantages, mask, clip_range=0.2)
    assert -old_token_mean.item() == pytest.approx(objective["bnpo"])  # what llmkit computed before
    assert objective["dr_grpo"] == pytest.approx(-4 / (2 * 5))
    assert objective["dapo"] == pytest.approx(-4 / 6)  # one micro-batch that is the whole step


def test_dapo_weighs_every_token_of_the_step_alike_however_it_was_split():
    """Two processes × two accumulated micro-batches of very different lengths: each micro-batch's
    token sum over the step's tokens per micro-batch, averaged as the engine does (DeepSpeed: ÷
    grad_accum, mean over processes), is the mean over every token of the step."""
    g = torch.Generator().manual_seed(0)
    lengths = [[1, 2], [6, 6], [3, 1], [5, 4]]  # [process][micro-batch] → two responses each
    batches = []
    for pair in lengths:
        mask = (torch.arange(6)[None] < torch.tensor(pair)[:, None]).long()
        batches.append((torch.randn(2, 6, generator=g, dtype=torch.float64), mask))
    step_tokens = sum(m.sum().item() for _, m in batches)
    per_micro_batch = step_tokens / len(batches)
    engine_mean = sum(aggregate_token_loss(x, m, "dapo", tokens_per_micro_batch=per_micro_batch)
                      for x, m in batches) / len(batches)
    every_token = torch.cat([x[m.bool()] for x, m in batches])
    assert engine_mean.item() == pytest.approx(every_token.mean().item(), rel=1e-12)
    bnpo_mean = sum(aggregate_token_loss(x, m, "bnpo") for x, m in batches) / len(batches)
    assert bnpo_mean.item() != pytest.approx(every_token.mean().item(), rel=1e-3)  # short ones weigh more




# ---- the settings -----------------------------------------------------------------------------

@pytest.mark.parametrize("settings, refusal", [
    (dict(loss_type="cispo"), "clip_range_high"),  # TRL's default cap, ε = 0.2, is rarely meant
    (dict(loss_type="grpo", sapo_temperature_neg=2.0), "loss_type=grpo ignores sapo_temperature_neg"),
    (dict(loss_type="sapo", ratio_max=3.0), "loss_type=sapo ignores ratio_max"),
    (dict(loss_type="vespo", importance_sampling_level="sequence"), "importance_sampling_level=token"),
    (dict(loss_type="sapo", sapo_temperature_pos=0.0), "sapo_temperature_pos must be > 0"),
])
def test_settings_a_loss_type_would_not_read_are_refused(settings, refusal):
    with pytest.raises(ConfigError, match=refusal):
        PpoConfig(algo="grpo", **settings)


def test_the_loss_settings_are_grpos_alone():
    with pytest.raises(ConfigError, match="algo=rloo ignores importance_sampling_level"):
        PpoConfig(algo="rloo", importance_sampling_level="sequence")
    assert PpoConfig(algo="grpo", loss_type="cispo", clip_range_high=5.0).clip_range_high == 5.0
