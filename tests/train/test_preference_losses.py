"""ORPO and SimPO (`llmkit dpo --set loss_type=orpo|simpo`) against TRL 1.16's own code, offline:
the same logits through llmkit's DpoTask.loss and through TRL's ORPOTrainer / CPOTrainer
`get_batch_loss_metrics` (their `concatenated_forward`, `get_batch_logps`, `odds_ratio_loss` /
`cpo_loss` and the loss they assemble), called on a stand-in trainer object, since building the
trainers needs a model and a dataset that add nothing here. Losses and gradients w.r.t. every logit
to 1e-5.

Where llmkit differs by design: ORPO's NLL term. TRL's ORPOTrainer takes it over every attended
token, prompt included; llmkit over the reply tokens only (as `llmkit sft`). TRL is given an
attention mask that is 1 exactly on the reply tokens, so that its NLL is that one too — the
stand-in model ignores the mask, so nothing else changes.
"""

from __future__ import annotations

import os
import types
from types import SimpleNamespace

import pytest
import torch

from llmkit.data.chat import IGNORE_INDEX
from llmkit.errors import ConfigError
from llmkit.train.dpo import DpoConfig, DpoTask
from llmkit.train.losses import log1mexp, orpo_loss, simpo_loss

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl.experimental.cpo import CPOTrainer  # noqa: E402
from trl.experimental.orpo import ORPOTrainer  # noqa: E402

REL = 1e-5  # the parity asked of every loss and gradient, relative to its largest entry
PAIRS, WIDTH, VOCAB = 4, 9, 11


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rel: float = REL):
    """|actual − expected| ≤ rel · max|expected|, entry by entry."""
    assert actual.shape == expected.shape
    scale = expected.detach().abs().max().clamp(min=1e-12)
    err = ((actual.detach() - expected.detach()).abs().max() / scale).item()
    assert err <= rel, f"relative error {err:.2e} > {rel:.0e}"


class GivenLogits(torch.nn.Module):
    """The model of both trainers: these logits [rows, T, V], whatever the input. llmkit's forward
    asks for the logits at the labelled positions only (`logits_at`), TRL's for all of them."""

    aux_loss = 0.0

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, input_ids, position_ids=None, doc_ids=None, logits_at=None, **_):
        return SimpleNamespace(logits=self.logits) if logits_at is None else self.logits[logits_at]


def pair_batch(seed: int = 0):
    """(llmkit's pair batch: chosen rows then rejected, labels aligned with input_ids; logits
    [2B, T, V] in float64), the replies of unequal lengths (1..T−2 tokens) ending each row, so a
    per-token mean and a sum differ."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, WIDTH - 1, (2 * PAIRS,), generator=g)
    reply = torch.arange(WIDTH)[None] >= WIDTH - lengths[:, None]
    input_ids = torch.randint(0, VOCAB, (2 * PAIRS, WIDTH), generator=g)
    labels = input_ids.masked_fill(~reply, IGNORE_INDEX)
    logits = 2 * torch.randn(2 * PAIRS, WIDTH, VOCAB, generator=g, dtype=torch.float64)
    return {"input_ids": input_ids, "labels": labels}, logits


def trl_batch(batch: dict) -> dict:
    """The same pairs as TRL's collator hands them over; attention 1 on the reply tokens only (see
    the module's docstring: ORPO's NLL)."""
    attention = (batch["labels"] != IGNORE_INDEX).long()
    out = {}
    for side, rows in (("chosen", slice(0, PAIRS)), ("rejected", slice(PAIRS, None))):
        out |= {f"{side}_input_ids": batch["input_ids"][rows], f"{side}_labels": batch["labels"][rows],
                f"{side}_attention_mask": attention[rows]}
    return out


def trl_stand_in(trainer_class, **settings):
    """An object that TRL's `trainer_class` methods run on: its settings, a CPU accelerator that
    gathers nothing, and the trainer's own methods bound to it."""
    stand_in = SimpleNamespace(**{
        "is_encoder_decoder": False, "padding_value": 0, "pad_token_id": 0, "aux_loss_enabled": False,
        "alpha": 0.0, "label_smoothing": 0.0,
        "accelerator": SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x),
        **settings})
    for name in ("concatenated_forward", "odds_ratio_loss", "cpo_loss"):
        if hasattr(trainer_class, name):
            setattr(stand_in, name, types.MethodType(getattr(trainer_class, name), stand_in))
    for name in ("concatenated_inputs", "get_batch_logps"):  # static methods
        setattr(stand_in, name, getattr(trainer_class, name))
    return stand_in


def llmkit_and_trl(cfg: DpoConfig, trainer_class, **trl_settings):
    """((llmkit's loss, its gradient w.r.t. the logits), (TRL's loss, its gradient)) on one batch."""
    batch, logits = pair_batch()
    leaf = logits.clone().requires_grad_()
    ours, metrics = DpoTask(GivenLogits(leaf), None, None, cfg).loss(GivenLogits(leaf), batch)
    our_grad, = torch.autograd.grad(ours, leaf)
    leaf = logits.clone().requires_grad_()
    stand_in = trl_stand_in(trainer_class, beta=cfg.beta, **trl_settings)
    theirs, their_metrics = trainer_class.get_batch_loss_metrics(stand_in, GivenLogits(leaf),
                                                                 trl_batch(batch))
    their_grad, = torch.autograd.grad(theirs, leaf)
    assert metrics["rewards/margins"].item() == pytest.approx(their_metrics["rewards/margins"], rel=1e-9)
    assert their_grad.abs().sum() > 0
    return (ours, our_grad), (theirs, their_grad)


def test_orpo_loss_and_its_gradient_equal_trls_orpo_trainer():
    """λ = 0.25 (TRL's `beta`, default 0.1): NLL of the chosen replies − λ·mean log σ(log odds ratio)
    of their mean per-token log-probs."""
    (ours, our_grad), (theirs, their_grad) = llmkit_and_trl(
        DpoConfig(loss_type="orpo", beta=0.25), ORPOTrainer)
    assert_close(ours, theirs)
    assert_close(our_grad, their_grad)


SIMPO_CASES = {
    "simpo": (dict(beta=2.0, simpo_gamma=0.7), dict(cpo_alpha=0.0)),
    # TRL's default CPO-SimPO mix (the chosen NLL, weight cpo_alpha) with conservative smoothing
    "cpo_simpo_smoothed": (dict(beta=2.5, simpo_gamma=1.2, cpo_alpha=1.0, label_smoothing=0.1),
                           dict(cpo_alpha=1.0, label_smoothing=0.1)),
}


@pytest.mark.parametrize("case", list(SIMPO_CASES))
def test_simpo_loss_and_its_gradient_equal_trls_cpo_trainer(case):
    settings, trl_settings = SIMPO_CASES[case]
    cfg = DpoConfig(loss_type="simpo", **settings)
    (ours, our_grad), (theirs, their_grad) = llmkit_and_trl(
        cfg, CPOTrainer, loss_type="simpo", simpo_gamma=cfg.simpo_gamma, **trl_settings)
    assert_close(ours, theirs)
    assert_close(our_grad, their_grad)


def test_pure_losses_equal_trls_on_the_same_log_probs():
    """The functions alone, on mean log-probs close to 0 too (where log(1 − eˣ) cancels)."""
    g = torch.Generator().manual_seed(1)
    chosen = torch.cat([-3 * torch.rand(5, generator=g, dtype=torch.float64),
                        torch.tensor([-1e-6, -0.69, -0.7], dtype=torch.float64)])
    rejected = -3 * torch.rand(8, generator=g, dtype=torch.float64)
    trl_orpo = trl_stand_in(ORPOTrainer, beta=0.3).odds_ratio_loss(chosen, rejected)
    ours = orpo_loss(chosen, rejected, lam=0.3)
    assert_close(-ours[0], trl_orpo[0])  # TRL returns +λ·log σ and subtracts its mean
    assert_close(ours[1], trl_orpo[1]) and assert_close(ours[2], trl_orpo[2])
    trl_simpo = trl_stand_in(CPOTrainer, beta=2.0, loss_type="simpo", simpo_gamma=0.8,
                             label_smoothing=0.05).cpo_loss(chosen, rejected)
    ours = simpo_loss(chosen, rejected, beta=2.0, gamma=0.8, label_smoothing=0.05)
    for a, b in zip(ours, trl_simpo):
        assert_close(a, b)
    x = torch.tensor([-1e-12, -1e-3, -0.6931, -0.6932, -5.0, -40.0], dtype=torch.float64)
    assert_close(log1mexp(x), torch.log(1 - torch.exp(x.to(torch.float64))), rel=1e-6)


def test_orpo_and_simpo_hold_no_reference_and_average_per_token():
    for loss_type in ("orpo", "simpo"):
        cfg = DpoConfig(loss_type=loss_type)
        assert not cfg.uses_reference and cfg.average_logps
    assert DpoConfig(loss_type="orpo").chosen_nll_weight == 1.0
    assert DpoConfig(loss_type="simpo", cpo_alpha=0.4).chosen_nll_weight == 0.4
    assert DpoConfig(loss_type="sigmoid", rpo_alpha=0.3).chosen_nll_weight == 0.3


@pytest.mark.parametrize("settings, named", [
    (dict(loss_type="orpo", precompute_ref=False), "precompute_ref=false holds a reference"),
    (dict(loss_type="simpo", precompute_ref=False), "precompute_ref=false holds a reference"),
    (dict(loss_type="orpo", label_smoothing=0.1), "label_smoothing applies to .* not orpo"),
    (dict(loss_type="orpo", rpo_alpha=0.5), "rpo_alpha does not apply to orpo"),
    (dict(loss_type="simpo", rpo_alpha=0.5), "rpo_alpha does not apply to simpo: .* is cpo_alpha"),
    (dict(loss_type="sigmoid", simpo_gamma=1.0), "simpo_gamma applies to loss_type=simpo only"),
    (dict(loss_type="orpo", cpo_alpha=1.0), "cpo_alpha applies to loss_type=simpo only"),
    (dict(loss_type="simpo", cpo_alpha=-1.0), "cpo_alpha must be >= 0"),
])
def test_settings_that_do_not_apply_are_refused_by_name(settings, named):
    with pytest.raises(ConfigError, match=named):
        DpoConfig(**settings)
