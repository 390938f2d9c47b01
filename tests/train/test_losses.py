import math

import pytest
import torch

from llmkit.train.losses import IGNORE_INDEX, bradley_terry_loss, dpo_loss, masked_mean, token_logps, whiten
from tests.train.reference_losses import sequence_logps, sft_loss


def _sigmoid(x):
    return 1 / (1 + torch.exp(-x))


@pytest.fixture
def logps():
    g = torch.Generator().manual_seed(0)
    return [-torch.rand(8, generator=g, dtype=torch.float64) * 20 for _ in range(4)]


def test_token_logps_are_log_softmax_of_the_next_label():
    logits = torch.randn(2, 5, 7)
    labels = torch.tensor([[IGNORE_INDEX, 3, 1, IGNORE_INDEX, 6], [2, 2, 2, 2, 2]])
    logps, mask = token_logps(logits, labels)
    expected = torch.log_softmax(logits, -1)
    assert mask.tolist() == [[True, True, False, True], [True] * 4]
    assert logps[0, 0] == pytest.approx(expected[0, 0, 3].item(), abs=1e-5)
    assert logps[0, 3] == pytest.approx(expected[0, 3, 6].item(), abs=1e-5)
    assert logps[0, 2] == 0  # ignored positions contribute nothing to sums
    assert sequence_logps(logits, labels)[1] == pytest.approx(expected[1, :4, 2].sum().item(), abs=1e-5)
    assert sequence_logps(logits, labels, average=True)[0] == pytest.approx(
        (expected[0, 0, 3] + expected[0, 1, 1] + expected[0, 3, 6]).item() / 3, abs=1e-5)


def test_sft_loss_is_mean_cross_entropy_over_labelled_tokens_only():
    logits = torch.randn(2, 4, 5)
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 4, 1], [IGNORE_INDEX, 0, IGNORE_INDEX, 2]])
    lsm = torch.log_softmax(logits, -1)
    picked = [lsm[0, 1, 4], lsm[0, 2, 1], lsm[1, 0, 0], lsm[1, 2, 2]]
    assert sft_loss(logits, labels).item() == pytest.approx(-sum(picked).item() / 4, abs=1e-5)


def test_bradley_terry_loss_matches_formula_with_margin_and_centring(logps):
    rc, rr, margin, _ = logps
    expected = -torch.log(_sigmoid(rc - rr - margin)).mean() + 0.01 * ((rc + rr) ** 2).mean()
    got = bradley_terry_loss(rc, rr, margin=margin, center_coef=0.01)
    assert got.item() == pytest.approx(expected.item(), rel=1e-9)
    assert bradley_terry_loss(rc, rr).item() == pytest.approx(
        -torch.log(_sigmoid(rc - rr)).mean().item(), rel=1e-9)


def test_dpo_sigmoid_is_eq7_of_the_dpo_paper(logps):
    pc, pr, rc, rr = logps
    beta = 0.3
    losses, chosen_r, rejected_r = dpo_loss(pc, pr, rc, rr, beta=beta)
    expected = -torch.log(_sigmoid(beta * ((pc - rc) - (pr - rr))))
    torch.testing.assert_close(losses, expected)
    torch.testing.assert_close(chosen_r, beta * (pc - rc))
    torch.testing.assert_close(rejected_r, beta * (pr - rr))


def test_cdpo_mixes_both_label_directions(logps):
    pc, pr, rc, rr = logps
    beta, eps = 0.1, 0.2
    h = (pc - rc) - (pr - rr)
    expected = -(1 - eps) * torch.log(_sigmoid(beta * h)) - eps * torch.log(_sigmoid(-beta * h))
    losses, _, _ = dpo_loss(pc, pr, rc, rr, beta=beta, loss_type="cdpo", label_smoothing=eps)
    torch.testing.assert_close(losses, expected)


def test_robust_dpo_is_unbiased_under_label_noise(logps):
    pc, pr, rc, rr = logps
    beta, eps = 0.1, 0.2
    h = (pc - rc) - (pr - rr)
    expected = ((1 - eps) * -torch.log(_sigmoid(beta * h))
                - eps * -torch.log(_sigmoid(-beta * h))) / (1 - 2 * eps)
    losses, _, _ = dpo_loss(pc, pr, rc, rr, beta=beta, loss_type="robust", label_smoothing=eps)
    torch.testing.assert_close(losses, expected)


def test_ipo_is_squared_distance_to_half_inverse_beta(logps):
    pc, pr, rc, rr = logps
    beta = 0.5
    losses, _, _ = dpo_loss(pc, pr, rc, rr, beta=beta, loss_type="ipo")
    torch.testing.assert_close(losses, ((pc - rc) - (pr - rr) - 1 / (2 * beta)) ** 2)


def test_reference_free_ignores_the_reference(logps):
    pc, pr, rc, rr = logps
    losses, chosen_r, _ = dpo_loss(pc, pr, rc, rr, beta=0.1, loss_type="reference_free")
    torch.testing.assert_close(losses, -torch.log(_sigmoid(0.1 * (pc - pr))))
    torch.testing.assert_close(chosen_r, 0.1 * pc)


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_losses_at_step_one_when_policy_equals_reference(logps, beta):
    pc, pr, _, _ = logps
    sigmoid, _, _ = dpo_loss(pc, pr, pc.clone(), pr.clone(), beta=beta)
    ipo, _, _ = dpo_loss(pc, pr, pc.clone(), pr.clone(), beta=beta, loss_type="ipo")
    assert torch.allclose(sigmoid, torch.full_like(sigmoid, math.log(2)))
    assert torch.allclose(ipo, torch.full_like(ipo, 1 / (4 * beta ** 2)))


def test_dpo_gradient_raises_chosen_and_lowers_rejected(logps):
    pc, pr, rc, rr = (t.clone().requires_grad_(i < 2) for i, t in enumerate(logps))
    losses, _, _ = dpo_loss(pc, pr, rc, rr, beta=0.1)
    losses.sum().backward()
    assert (pc.grad < 0).all() and (pr.grad > 0).all()


# ---- masked statistics -------------------------------------------------------------------------

def test_whiten_gives_zero_mean_unit_std_over_masked_positions():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    w = whiten(x, mask)
    real = w[mask.bool()]
    assert real.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert real.std().item() == pytest.approx(1.0, abs=1e-6)  # unbiased, as torch.std
    expected = (torch.tensor([1.0, 2, 3, 4, 5]) - 3) / math.sqrt(2.5)
    assert real.tolist() == pytest.approx(expected.tolist(), abs=1e-6)
    assert w[~mask.bool()].abs().sum() == 0


def test_whiten_without_mean_shift_keeps_the_mean():
    x = torch.tensor([[1.0, 3.0]])
    w = whiten(x, torch.ones(1, 2), shift_mean=False)
    assert w.tolist()[0] == pytest.approx([2 - 1 / math.sqrt(2), 2 + 1 / math.sqrt(2)], abs=1e-6)


def test_masked_mean_along_a_dimension():
    x = torch.tensor([[1.0, 3.0, 100.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(x, mask, dim=1).tolist() == [2.0, 2.0]
