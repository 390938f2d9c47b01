"""The per-token maths of PPO / GRPO / RLOO (llmkit.train.rl_losses) against hand-computed cases."""
import math

import pytest
import torch

from llmkit.train.rl_losses import (AdaptiveKLController, RunningMoments, clip_scores,
                                    clipped_policy_loss, clipped_policy_token_loss, clipped_value_loss,
                                    entropy_from_logits, gae, group_relative_advantages, kl_estimate,
                                    logprobs_of, penalize_missing_stop, token_rewards)


# ---- PPO / GRPO: pure functions against hand-computed cases ---------------------------------

def test_gae_matches_hand_computation_and_ignores_padding():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 9.0]])  # the 9 sits on padding and must not count
    values = torch.tensor([[0.5, 0.4, 0.3, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # δ2 = 1 − 0.3 = 0.7;  δ1 = 0.9·0.3 − 0.4 = −0.13;  δ0 = 0.9·0.4 − 0.5 = −0.14
    a2 = 0.7
    a1 = -0.13 + 0.72 * a2
    a0 = -0.14 + 0.72 * a1
    assert advantages.tolist()[0] == pytest.approx([a0, a1, a2, 0.0])
    assert returns.tolist()[0] == pytest.approx([a0 + 0.5, a1 + 0.4, a2 + 0.3, 0.0])


def test_gae_with_gamma_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    values = torch.tensor([[0.5, 0.5, 0.5]])
    advantages, returns = gae(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert advantages.tolist()[0] == pytest.approx([5.5, 4.5, 2.5])
    assert returns.tolist()[0] == pytest.approx([6.0, 5.0, 3.0])


def test_k1_and_k3_estimators():
    logp = torch.tensor([math.log(0.5), math.log(0.2)])
    ref = torch.tensor([math.log(0.25), math.log(0.4)])
    assert kl_estimate(logp, ref, "k1").tolist() == pytest.approx([math.log(2), math.log(0.5)])
    # k3 = ρ − 1 − log ρ with ρ = π_ref / π
    assert kl_estimate(logp, ref, "k3").tolist() == pytest.approx(
        [0.5 - 1 - math.log(0.5), 2 - 1 - math.log(2)])
    same = kl_estimate(logp, logp, "k3")
    assert same.abs().max() == 0 and kl_estimate(logp, logp, "k1").abs().max() == 0
    with pytest.raises(ValueError, match="k2"):
        kl_estimate(logp, ref, "k2")


def test_k1_and_k3_are_unbiased_estimates_of_the_true_kl():
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.2, 0.5, 0.3])
    true_kl = (p * (p / q).log()).sum().item()
    logp, logq = p.log(), q.log()
    for estimator in ("k1", "k3"):  # expectation under p, computed exactly
        assert (p * kl_estimate(logp, logq, estimator)).sum().item() == pytest.approx(true_kl)


def test_clipped_policy_loss_equals_the_ppo_formula():
    old = torch.zeros(1, 4)
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.7]])
    advantages = torch.tensor([[1.0, 1.0, -2.0, -1.0]])
    mask = torch.tensor([[1, 1, 1, 1]])
    loss, clipfrac = clipped_policy_loss(ratios.log(), old, advantages, mask, clip_range=0.2)
    # per token: max(−A·ρ, −A·clip(ρ, 0.8, 1.2))
    per_token = [max(-1.0 * 1.5, -1.0 * 1.2),   # A>0, ρ above the range: clipped -> −1.2
                 max(-1.0 * 0.5, -1.0 * 0.8),   # A>0, ρ below: unclipped −0.5 (pessimistic)
                 max(2.0 * 1.1, 2.0 * 1.1),     # inside the range
                 max(1.0 * 0.7, 1.0 * 0.8)]     # A<0, ρ below: clipped 0.8
    assert loss.item() == pytest.approx(sum(per_token) / 4)
    assert clipfrac.item() == pytest.approx(2 / 4)


def test_clipped_policy_loss_gradient_vanishes_where_clipped():
    logp = torch.tensor([[math.log(1.5), math.log(1.1)]], requires_grad=True)
    loss, _ = clipped_policy_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), 0.2)
    loss.backward()
    assert logp.grad[0, 0] == 0  # clipped: no incentive to move further
    assert logp.grad[0, 1].item() == pytest.approx(-1.1 / 2)


def test_clipped_policy_loss_ignores_padding():
    logp = torch.tensor([[0.1, 5.0]])
    loss, _ = clipped_policy_loss(logp, torch.zeros(1, 2), torch.ones(1, 2),
                                  torch.tensor([[1, 0]]), 0.2)
    assert loss.item() == pytest.approx(-math.exp(0.1))


def test_clipped_value_loss_equals_its_formula():
    values = torch.tensor([[1.0, 0.0, 2.0]])
    old = torch.tensor([[0.0, 0.0, 1.9]])
    returns = torch.tensor([[0.5, 1.0, 0.0]])
    loss, clipfrac = clipped_value_loss(values, old, returns, torch.ones(1, 3), clip_range=0.2)
    # V_clip = [0.2, 0.0, 2.0]
    per_token = [max((1.0 - 0.5) ** 2, (0.2 - 0.5) ** 2), max(1.0, 1.0), max(4.0, 4.0)]
    assert loss.item() == pytest.approx(0.5 * sum(per_token) / 3)
    assert clipfrac.item() == 0.0
    values = torch.tensor([[1.0]])  # moved away from the return: the clipped error is larger
    loss, clipfrac = clipped_value_loss(values, torch.zeros(1, 1), torch.full((1, 1), 3.0),
                                        torch.ones(1, 1), clip_range=0.2)
    assert loss.item() == pytest.approx(0.5 * 2.8 ** 2) and clipfrac.item() == 1.0


def test_group_relative_advantages_are_zero_mean_unit_std_per_group():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 3.0, 3.0, 3.0, 0.0, 1.0, 2.0, 5.0])
    adv = group_relative_advantages(scores, group_size=4).view(3, 4)
    assert adv.mean(-1).abs().max().item() < 1e-6
    assert adv[0].tolist() == pytest.approx([0.5 / (0.57735 + 1e-4) * x for x in (1, -1, -1, 1)],
                                            rel=1e-4)
    assert adv[1].abs().max() == 0  # every sample scored the same: no signal
    assert adv[2].std().item() == pytest.approx(1.0, rel=1e-3)
    with pytest.raises(ValueError, match="groups of 5"):
        group_relative_advantages(scores, group_size=5)


def test_group_relative_advantages_scale_by_the_group_the_batch_or_nothing():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 3.0, 4.0, 2.0])
    centred = [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 1.0, -1.0]  # score − its group's mean
    none = group_relative_advantages(scores, group_size=4, scale="none")
    assert none.tolist() == pytest.approx(centred)  # Dr. GRPO: no division
    batch_std = scores.std().item()  # unbiased, over all 8 scores (TRL's nanstd)
    batch = group_relative_advantages(scores, group_size=4, scale="batch")
    assert batch.tolist() == pytest.approx([c / (batch_std + 1e-4) for c in centred], rel=1e-5)
    group = group_relative_advantages(scores, group_size=4, scale="group")
    stds = [math.sqrt(1 / 3)] * 4 + [math.sqrt(2 / 3)] * 4  # each group's unbiased std
    assert group.tolist() == pytest.approx([c / (s + 1e-4) for c, s in zip(centred, stds)], rel=1e-5)
    assert torch.equal(group, group_relative_advantages(scores, group_size=4))  # the default
    with pytest.raises(ValueError, match="scale_rewards"):
        group_relative_advantages(scores, group_size=4, scale="global")


def test_token_rewards_put_the_score_on_the_last_real_token():
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    rewards = token_rewards(torch.tensor([2.0, -1.0]), kl, mask, kl_coef=0.5)
    assert rewards.flatten().tolist() == pytest.approx([-0.05, -0.1, -0.15 + 2.0, -0.2 - 1.0, 0.0, 0.0])


def test_clip_scores():
    assert clip_scores(torch.tensor([-9.0, 1.0, 7.0]), 5.0).tolist() == [-5.0, 1.0, 5.0]
    assert clip_scores(torch.tensor([-9.0]), None).tolist() == [-9.0]


def test_missing_stop_penalty_lowers_only_the_cut_off_responses():
    scores = torch.tensor([2.0, 2.0, -1.0])
    stopped = torch.tensor([True, False, False])
    assert penalize_missing_stop(scores, stopped, 0.5).tolist() == [2.0, 1.5, -1.5]
    assert penalize_missing_stop(scores, stopped, None).tolist() == [2.0, 2.0, -1.0]


def test_adaptive_kl_controller_moves_beta_towards_the_target():
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    ctl.update(current_kl=12.0, n_steps=100)  # error clipped to +0.2
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 100 / 10000))
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    ctl.update(current_kl=5.7, n_steps=100)  # error −0.05
    assert ctl.value == pytest.approx(0.1 * (1 - 0.05 * 100 / 10000))


def test_running_moments_match_the_statistics_of_everything_seen():
    moments = RunningMoments()
    chunks = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0]), torch.tensor([-4.0, 0.5])]
    for c in chunks:
        moments.update(c)
    everything = torch.cat(chunks).double()
    assert moments.mean == pytest.approx(everything.mean().item())
    assert moments.std == pytest.approx(everything.std(unbiased=False).item())
    assert moments.normalize(torch.tensor([moments.mean])).item() == pytest.approx(0.0, abs=1e-6)


def test_entropy_and_logprobs_from_logits():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]]])
    assert entropy_from_logits(logits)[0, 0].item() == pytest.approx(math.log(4))
    p = torch.softmax(logits[0, 1], -1)
    assert entropy_from_logits(logits)[0, 1].item() == pytest.approx(-(p * p.log()).sum().item())
    lp = logprobs_of(logits, torch.tensor([[2, 0]]))
    assert lp.tolist()[0] == pytest.approx([math.log(0.25), p[0].log().item()])


def test_clip_higher_widens_only_the_upper_bound_of_the_ratio():
    """DAPO's clip-higher (TRL's epsilon_high): ρ = e^0.5 ≈ 1.65 with A > 0 is clipped at 1 + ε_high;
    ρ = e^-0.5 ≈ 0.61 with A < 0 still at 1 − ε."""
    old = torch.zeros(2)
    new = torch.tensor([0.5, -0.5])
    advantages = torch.tensor([1.0, -1.0])
    symmetric, _ = clipped_policy_token_loss(new, old, advantages, clip_range=0.2)
    higher, clipped = clipped_policy_token_loss(new, old, advantages, clip_range=0.2, clip_range_high=0.28)
    assert symmetric.tolist() == pytest.approx([-1.2, 0.8])
    assert higher.tolist() == pytest.approx([-1.28, 0.8])
    assert clipped.tolist() == [True, True]
