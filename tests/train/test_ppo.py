import copy
import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from llmkit.errors import ConfigError, UserError
from llmkit.model import packed_linear
from llmkit.model.decoding import left_pad
from llmkit.model.transformer import Transformer
from llmkit.model.config import ModelConfig
from llmkit.train.actor_critic import build_actor_critic
from llmkit.train.cpu_precision import missing_cpu_bf16
from llmkit.train.engine import Engine
from llmkit.train.rl_losses import logprobs_of
from llmkit.train.ppo import PpoConfig, PpoTask, run_ppo
from llmkit.train.rollouts import (Prompt, Samples, ends_with_stop, mean_over_processes, response_mask_of,
                                   select_rows)
from tests.make_fragments import make_command, make_dry_run
from tests.train.posttrain_fixtures import (memorizing_model, preference_rows, tiny_model,
                                            write_checkpoint_run, write_dataset)


# ---- rollouts (the per-token maths are tested in tests/train/test_rl_losses.py, the rewards in
# tests/rewards/test_verify.py) ---------------------------------------------------------------------------


def test_left_pad_and_response_mask():
    ids, mask = left_pad([[4, 5, 6], [7]], pad_id=0)
    assert ids.tolist() == [[4, 5, 6], [0, 0, 7]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    responses = torch.tensor([[3, 9, 9, 9], [3, 3, 8, 9], [3, 3, 3, 3]])
    # the first of either stop token ends a response; it is itself part of the response
    assert response_mask_of(responses, [9, 8]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0],
                                                            [1, 1, 1, 1]]
    assert response_mask_of(responses, []).tolist() == [[1] * 4] * 3


# ---- the task on a tiny model ------------------------------------------------------------------


TARGET = 5  # the token the toy reward asks for


def fraction_of_target(samples: Samples) -> torch.Tensor:
    """Toy reward: the share of response tokens that are TARGET."""
    hits = (samples.responses == TARGET) & samples.response_mask.bool()
    return hits.sum(-1).float() / samples.response_mask.sum(-1).clamp(min=1)


def tiny_setup(algo="ppo", max_steps=20, scorer=fraction_of_target, tie_embeddings=True, stop_ids=(),
               n_experts=0, **overrides):
    torch.manual_seed(0)
    policy = Transformer(ModelConfig(vocab_size=12, hidden_size=32, n_layers=1, n_heads=2,
                                     n_kv_heads=1, intermediate_size=64, max_seq_len=16,
                                     tie_embeddings=tie_embeddings,
                                     **({"n_experts": n_experts, "experts_top_k": 1} if n_experts else {})))
    policy.init_weights(seed=0)
    reference = copy.deepcopy(policy)
    settings = dict(algo=algo, prompts_per_rollout=16 if algo == "ppo" else 4, group_size=4,
                    ppo_epochs=2, max_new_tokens=6, kl_coef=0.01, max_steps=max_steps,
                    micro_batch_size=8, lr=2e-2, min_lr=2e-2, peak_flops=1e9)
    cfg = PpoConfig(**{**settings, **overrides})
    prompts = [Prompt([1 + i % 4, 2 + i % 3, 6 + i % 5]) for i in range(20)]
    model = build_actor_critic(policy, cfg)
    task = PpoTask(model, reference, prompts, scorer, cfg, stop_ids=list(stop_ids), pad_id=0,
                   decode=lambda ids: " ".join(map(str, ids)))
    return task, cfg


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_short_run_moves_parameters_and_raises_the_reward(tmp_path, algo):
    task, cfg = tiny_setup(algo)
    before = {k: v.detach().clone() for k, v in task.model.named_parameters()}
    Engine(tmp_path / "run", cfg.train_config(), task).fit()
    after = dict(task.model.named_parameters())
    assert all(p.requires_grad for p in after.values())  # nothing frozen (the head is tied)
    assert any(k.startswith("value_head.") for k in before) == (algo == "ppo")
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged, unchanged
    history = task.reward_history
    assert len(history) == 20 * 8 // (cfg.rollout_size * cfg.ppo_epochs)
    assert sum(history[-2:]) / 2 > sum(history[:2]) / 2 + 0.1, history
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    first = records[0]
    # step 1: the policy is the reference and the sampling policy: no KL, no clipping
    assert first["kl"] == 0.0
    assert first["clipfrac"] == 0.0
    for key in ("kl", "reward_mean", "entropy", "clipfrac", "policy_loss", "response_length"):
        assert key in first
    assert ("value_loss" in first) == (algo == "ppo")


def test_rollout_logprobs_are_those_of_the_sampling_temperature():
    # responses sampled at temperature T: the ratio and the KL must use log softmax(logits / T)
    task, cfg = tiny_setup("ppo", temperature=0.5)
    rollout = task.make_rollout(task.model)
    ids, attn, P = rollout["input_ids"], rollout["attention_mask"], rollout["prompt_len"]
    with torch.no_grad():
        logits = task.model.policy(ids, attention_mask=attn)[:, P - 1:-1].float()
    expected = torch.log_softmax(logits / 0.5, -1).gather(-1, ids[:, P:, None]).squeeze(-1)
    mask = rollout["response_mask"].bool()
    assert torch.allclose(rollout["logprobs"][mask], expected[mask], atol=1e-5)
    # the reference is the starting policy: at the same temperature it gives the same log-probs
    assert torch.allclose(rollout["ref_logprobs"][mask], expected[mask], atol=1e-5)


def test_grpo_at_beta_0_with_one_update_per_rollout_skips_both_no_grad_passes_and_loses_nothing(monkeypatch):
    # TRL's defaults: β 0 (the reference cannot change anything) and one optimizer step per
    # rollout (the loss runs on the sampling parameters: the old log-probs are its own, detached)
    task, cfg = tiny_setup("grpo", kl_coef=0.0, ppo_epochs=1, micro_batch_size=16)
    passes = []
    forward = task.model.forward
    monkeypatch.setattr(task.model, "forward", lambda *a: passes.append("policy") or forward(*a))
    monkeypatch.setattr(task.reference, "forward", lambda *a, **k: passes.append("reference"))
    monkeypatch.setattr(task.reference, "hidden_states", lambda *a, **k: passes.append("reference"))
    rollout = task.make_rollout(task.model)
    assert passes == [] and "logprobs" not in rollout and "ref_logprobs" not in rollout
    task._start_rollout(rollout)
    batch = task.next_batch(task.model)
    with torch.no_grad():
        logits, _ = forward(batch["input_ids"], batch["attention_mask"], batch["prompt_len"])
    with_passes = {**batch, "logprobs": logprobs_of(logits, batch["input_ids"][:, batch["prompt_len"]:]),
                   "ref_logprobs": torch.zeros_like(batch["response_mask"], dtype=torch.float32)}
    losses, grads = [], []
    for b in (batch, with_passes):
        task.model.zero_grad()
        loss, _ = task.loss(task.model, b)
        loss.backward()
        losses.append(loss.detach())
        grads.append(torch.cat([p.grad.flatten() for p in task.model.parameters()]))
    torch.testing.assert_close(losses[0], losses[1], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)


def test_two_updates_or_a_kl_keep_the_passes_they_need():
    task, _ = tiny_setup("grpo", kl_coef=0.04, ppo_epochs=1, micro_batch_size=16)
    rollout = task.make_rollout(task.model)
    assert "ref_logprobs" in rollout and "logprobs" not in rollout  # β > 0 reads the reference
    task, _ = tiny_setup("grpo", kl_coef=0.0, ppo_epochs=2, micro_batch_size=8)
    rollout = task.make_rollout(task.model)
    # two optimizer steps per pass: the second step's loss no longer runs on the sampling parameters
    assert "logprobs" in rollout and "ref_logprobs" not in rollout


def test_later_passes_read_the_first_pass_log_probs_which_are_the_sampling_pass_ones(tmp_path, monkeypatch):
    # two passes, one optimizer step each: the first pass's losses run on the parameters that
    # sampled, so their log-probs, detached, are what a sampling pass would give the second
    settings = dict(kl_coef=0.04, ppo_epochs=2, micro_batch_size=8, grad_accum=2, max_steps=4)
    task, cfg = tiny_setup("grpo", **settings)
    rollout = task.make_rollout(task.model)
    assert "logprobs" not in rollout and "ref_logprobs" in rollout
    with torch.no_grad():
        logits, _ = task.model(rollout["input_ids"], rollout["attention_mask"], rollout["prompt_len"])
    sampling_pass = logprobs_of(logits, rollout["input_ids"][:, rollout["prompt_len"]:])
    task._start_rollout(rollout)
    for _ in range(2):  # the first pass: two micro-batches of 8 of the 16 responses
        task.loss(task.model, task.next_batch(task.model))
    mask = rollout["response_mask"].bool()
    torch.testing.assert_close(rollout["logprobs"][mask], sampling_pass[mask], atol=1e-6, rtol=0)
    assert "logprobs" in task.next_batch(task.model)  # the second pass reads them

    def run(name, sampling_pass: bool):
        task, cfg = tiny_setup("grpo", **settings)
        monkeypatch.setattr(task, "needs_sampling_logprobs", lambda: sampling_pass)
        Engine(tmp_path / name, cfg.train_config(), task).fit()
        return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]

    kept, passed = run("kept", False), run("passed", True)
    for key in ("loss", "kl", "approx_kl_old", "clipfrac", "reward_mean"):
        assert [r[key] for r in kept] == pytest.approx([r[key] for r in passed], abs=1e-5), key


def test_rollouts_walk_every_prompt_once_per_epoch_and_repeat_them_for_grpo():
    task, _ = tiny_setup()  # 20 prompts, 16 per rollout
    first, second = task._next_prompts(), task._next_prompts()
    ids = [tuple(p.ids) for p in task.prompts]
    seen = [ids.index(tuple(p.ids)) for p in first + second[:4]]
    assert sorted(seen) == list(range(20))  # the first epoch: each prompt once
    assert (task.prompt_epoch, task.prompt_cursor) == (1, 12)
    grpo, _ = tiny_setup("grpo")  # 4 prompts × group of 4
    groups = [tuple(p.ids) for p in grpo._next_prompts()]
    assert len(groups) == 16 and all(len(set(groups[i:i + 4])) == 1 for i in range(0, 16, 4))


@pytest.mark.parametrize("algo", ["ppo", "rloo"])
def test_resume_at_a_rollout_boundary_repeats_the_uninterrupted_run(tmp_path, algo):
    def run(run_dir, max_steps):
        task, cfg = tiny_setup(algo, max_steps=max_steps, ppo_epochs=1)  # 16 responses: 2 steps per rollout
        Engine(run_dir, cfg.train_config(), task).fit()
        losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").open()]
        return task, losses

    straight, straight_losses = run(tmp_path / "straight", 4)
    run(tmp_path / "stopped", 2)
    resumed, resumed_losses = run(tmp_path / "stopped", 4)
    assert resumed_losses == straight_losses
    assert resumed.reward_history == straight.reward_history
    for p, q in zip(straight.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)


# ---- the options, in the loop -------------------------------------------------------------------


def test_adaptive_kl_steers_beta_once_per_rollout_in_the_loop(tmp_path):
    # 16 responses per rollout, horizon 16: β ← β·(1 + clip(KL / target − 1, ±0.2)) each rollout
    task, cfg = tiny_setup(max_steps=12, adaptive_kl=True, kl_target=0.05, kl_horizon=16)
    Engine(tmp_path / "run", cfg.train_config(), task).fit()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    per_rollout = {r["rollouts"]: (r["kl"], r["kl_coef"]) for r in records}
    assert sorted(per_rollout) == [1.0, 2.0, 3.0]  # 4 optimizer steps per rollout
    kls, betas = zip(*(per_rollout[k] for k in sorted(per_rollout)))
    assert betas[0] == cfg.kl_coef and kls[0] == pytest.approx(0.0, abs=1e-6)  # policy = reference
    beta = cfg.kl_coef
    for kl, logged in zip(kls, betas):
        assert logged == pytest.approx(beta, rel=1e-9)
        beta *= 1 + min(max(kl / cfg.kl_target - 1, -0.2), 0.2) * 16 / 16
    assert task.kl_ctl.value == pytest.approx(beta, rel=1e-9)
    assert len(set(betas)) == 3  # it moved every rollout
    fixed, _ = tiny_setup(max_steps=4)
    Engine(tmp_path / "fixed", cfg.train_config(), fixed).fit()
    assert fixed.kl_ctl.value == 0.01


POOL_ON_RANK = """
import json, sys, torch
from llmkit.train.rl_losses import AdaptiveKLController
from llmkit.train.rollouts import mean_over_processes
rank, init = int(sys.argv[1]), sys.argv[2]
torch.distributed.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=2)
kl, count = mean_over_processes(torch.tensor([1.0, 2.0] if rank == 0 else [6.0]))
controller = AdaptiveKLController(0.1, target=1.0, horizon=10)
controller.update(kl, n_steps=count)
print(json.dumps([kl, count, controller.value]))
torch.distributed.destroy_process_group()
"""


def test_adaptive_kl_pools_the_kl_and_sample_count_of_every_process(tmp_path):
    # alone, rank 0 (KL 1.5 over 2 samples) and rank 1 (KL 6 over 1) would move β apart
    assert mean_over_processes(torch.tensor([1.0, 2.0, 6.0])) == (3.0, 3)  # one process: its own
    init = tmp_path / "init"
    ranks = [subprocess.Popen([sys.executable, "-c", POOL_ON_RANK, str(r), str(init)],
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    outputs = [json.loads(r.communicate(timeout=120)[0]) for r in ranks]
    assert [r.returncode for r in ranks] == [0, 0]
    assert outputs[0] == outputs[1] == [3.0, 3, pytest.approx(0.1 * (1 + 0.2 * 3 / 10))]


def test_normalize_reward_scales_scores_by_the_moments_of_every_score_seen():
    batches = iter([torch.arange(16.0), 10 + 2 * torch.arange(16.0)])
    task, _ = tiny_setup(scorer=lambda samples: next(batches), normalize_reward=True, reward_clip=None,
                         kl_coef=0.0, gamma=1.0, lam=1.0, whiten_advantages=False)
    task.make_rollout(task.model)
    rollout = task.make_rollout(task.model)
    seen = torch.cat([torch.arange(16.0), 10 + 2 * torch.arange(16.0)]).double()
    expected = (10 + 2 * torch.arange(16.0).double() - seen.mean()) / (seen.std(unbiased=False) + 1e-8)
    # no KL penalty, γ = λ = 1, values 0 (a new head): every token's return is the sequence's score
    assert rollout["returns"][:, 0].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    assert rollout["returns"][:, -1].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    assert task.score_moments.count == 32 and task.reward_history[-1] == pytest.approx(25.0)  # raw


def test_entropy_coef_subtracts_the_entropy_bonus_and_its_gradient():
    task, cfg = tiny_setup()
    batch = select_rows(task.make_rollout(task.model), torch.arange(8))
    params = [p for p in task.model.parameters() if p.requires_grad]
    plain, metrics = task.loss(task.model, batch)
    task.cfg = dataclasses.replace(cfg, entropy_coef=0.5)
    bonus, _ = task.loss(task.model, batch)
    logits, _ = task.model(batch["input_ids"], batch["attention_mask"], batch["prompt_len"])
    p = torch.softmax(logits.double(), -1)
    mask = batch["response_mask"]
    entropy = ((-(p * p.log()).sum(-1)) * mask).sum() / mask.sum()  # temperature 1
    assert metrics["entropy"].item() == pytest.approx(entropy.item(), rel=1e-5)
    assert bonus.item() == pytest.approx(plain.item() - 0.5 * entropy.item(), rel=1e-5)
    got = torch.autograd.grad(bonus - plain, params, allow_unused=True)
    want = torch.autograd.grad(-0.5 * entropy.float(), params, allow_unused=True)
    for g, w in zip(got, want):
        if w is None:
            assert g is None or g.abs().max() == 0
        else:
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)
    assert any(w is not None and w.abs().max() > 0 for w in want)


def test_reward_is_not_clipped_by_default_and_a_missing_stop_token_is_penalised():
    STOP = 3
    task, cfg = tiny_setup(stop_ids=[STOP], scorer=lambda samples: torch.full((len(samples.texts),), 9.0),
                           missing_eos_penalty=0.5, kl_coef=0.0, lam=1.0, whiten_advantages=False)
    assert cfg.reward_clip is None  # TRL clips no reward-model score either
    rollout = task.make_rollout(task.model)
    responses, mask = rollout["input_ids"][:, rollout["prompt_len"]:], rollout["response_mask"].bool()
    stopped = ((responses == STOP) & mask).any(-1)
    assert 0 < int(stopped.sum()) < len(stopped)  # both kinds in this rollout
    # no KL penalty, γ = λ = 1, values 0 (a new head): every token's return is the sequence's score
    expected = 9.0 - 0.5 * (~stopped).float()
    assert rollout["returns"][:, 0].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    assert task.reward_history[-1] == pytest.approx(9.0)  # the scorer's own score, logged as reward


@pytest.mark.parametrize("algo", ["ppo", "grpo", "rloo"])
def test_loss_includes_the_moe_load_balancing_loss(algo):
    task, _ = tiny_setup(algo, n_experts=2)
    batch = select_rows(task.make_rollout(task.model), torch.arange(8))
    with_balancing, _ = task.loss(task.model, batch)
    balancing = task.model.aux_loss.detach()
    assert balancing.item() > 0
    task.model.policy.config.router_aux_loss_coef = 0.0
    without, _ = task.loss(task.model, batch)
    assert with_balancing.item() == pytest.approx(without.item() + balancing.item(), rel=1e-6)


def test_grad_accum_must_divide_the_micro_batches_of_one_pass():
    # 16 responses in micro-batches of 4: a step of 3 would take the last of one pass and the
    # first two of the next
    with pytest.raises(ConfigError, match="grad_accum=3 does not divide the 4 micro-batches"):
        PpoConfig(prompts_per_rollout=16, micro_batch_size=4, grad_accum=3)
    assert PpoConfig(prompts_per_rollout=16, micro_batch_size=4, grad_accum=2).grad_accum == 2


# ---- grpo's loss and options ------------------------------------------------------------------


def first_step(run_dir, **overrides):
    task, cfg = tiny_setup("grpo", max_steps=1, stop_ids=[3], **overrides)
    Engine(run_dir, cfg.train_config(), task).fit()
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])


def test_dapo_accumulation_gives_the_gradient_of_one_micro_batch_of_the_whole_step(tmp_path):
    """Step 1 takes the same 8 responses of the same rollout either way (grad_accum 2 × 4 or
    1 × 8), of different lengths (stop token 3): dapo divides by the tokens of the whole step, so
    the gradient is the same; bnpo's per-micro-batch token means weigh the shorter half more."""
    grad_norms = {}
    for loss_type in ("dapo", "bnpo"):
        for accum, size in ((2, 4), (1, 8)):
            record = first_step(tmp_path / f"{loss_type}-{accum}", loss_type=loss_type,
                                grad_accum=accum, micro_batch_size=size)
            grad_norms[loss_type, accum] = record["grad_norm"]
    assert grad_norms["dapo", 2] == pytest.approx(grad_norms["dapo", 1], rel=1e-5)
    assert grad_norms["bnpo", 1] == pytest.approx(grad_norms["dapo", 1], rel=1e-5)  # one micro-batch
    assert grad_norms["bnpo", 2] != pytest.approx(grad_norms["bnpo", 1], rel=1e-3)


def test_masked_truncated_completions_are_scored_but_not_trained_on():
    """mask_truncated_completions (DAPO, TRL's): a response without its stop token keeps its place
    in its group's advantages but adds no token to the loss or to dapo's normaliser."""
    rollouts = {}
    for masked in (False, True):
        task, _ = tiny_setup("grpo", stop_ids=[3], mask_truncated_completions=masked)
        rollouts[masked] = task.make_rollout(task.model)
    full, masked = rollouts[False], rollouts[True]
    stopped = ends_with_stop(full["input_ids"][:, full["prompt_len"]:], full["response_mask"], [3])
    assert 0 < stopped.sum() < len(stopped)  # both kinds in the rollout
    assert torch.equal(masked["response_mask"][stopped], full["response_mask"][stopped])
    assert masked["response_mask"][~stopped].sum() == 0 < full["response_mask"][~stopped].sum()
    assert torch.equal(masked["advantages"][stopped], full["advantages"][stopped])
    task.loss(task.model, select_rows(masked, torch.arange(8)))[0].backward()  # finite with empty rows
    assert task.items_in_batch(select_rows(masked, torch.arange(16))) == masked["response_mask"].sum()


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_grpo_loss_aggregates_per_token_losses_by_loss_type(loss_type):
    task, cfg = tiny_setup("grpo", stop_ids=[3], loss_type=loss_type)
    rollout = task.make_rollout(task.model)
    batch = select_rows(rollout, torch.arange(8))
    loss, metrics = task.loss(task.model, batch)
    mask = batch["response_mask"].double()
    # on-policy (ρ = 1) and policy = reference (KL 0): the per-token loss is −A
    per_token = -batch["advantages"].double()
    want = {"grpo": ((per_token * mask).sum(-1) / mask.sum(-1)).mean(),
            "bnpo": (per_token * mask).sum() / mask.sum(),
            "dr_grpo": (per_token * mask).sum() / (8 * cfg.max_new_tokens),
            "dapo": (per_token * mask).sum() / mask.sum()}[loss_type]  # a batch that is its own step
    assert metrics["kl_loss"].item() == pytest.approx(0.0, abs=1e-6)
    assert loss.item() == pytest.approx(want.item(), abs=1e-6)
    assert metrics["policy_loss"].item() == pytest.approx(want.item(), abs=1e-6)
    lengths = mask.sum(-1)
    assert lengths.min() < lengths.max()  # the types differ on this batch


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_advantages_follow_scale_rewards(scale):
    scores = torch.tensor([0.0, 1, 1, 2, 5, 5, 5, 9, 0, 0, 0, 0, 1, 2, 3, 4])
    task, _ = tiny_setup("grpo", scorer=lambda samples: scores, scale_rewards=scale)
    rollout = task.make_rollout(task.model)
    grouped = scores.view(4, 4)
    centred = (grouped - grouped.mean(-1, keepdim=True)).view(-1)
    divisor = {"group": grouped.std(-1, keepdim=True).expand(4, 4).reshape(-1) + 1e-4,
               "batch": scores.std() + 1e-4, "none": torch.tensor(1.0)}[scale]
    assert rollout["advantages"][:, 0].tolist() == pytest.approx((centred / divisor).tolist(), rel=1e-5)


def test_grpo_loss_weighs_the_kl_by_the_beta_the_rollout_logged():
    task, cfg = tiny_setup("grpo", adaptive_kl=True, kl_target=0.05, kl_horizon=16)
    task.kl_ctl.value = 0.3  # as if adaptive_kl had moved it away from kl_coef=0.01
    batch = select_rows(task.make_rollout(task.model), torch.arange(8))
    assert task.kl_ctl.value != 0.3  # already updated for the next rollout
    with torch.no_grad():  # move the policy off the reference: KL > 0
        for p in task.model.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    loss, metrics = task.loss(task.model, batch)
    assert metrics["kl_coef"] == 0.3 and cfg.kl_coef == 0.01
    assert metrics["kl_loss"].item() > 1e-4
    assert loss.item() == pytest.approx(metrics["policy_loss"].item() + 0.3 * metrics["kl_loss"].item(),
                                        rel=1e-6)


@pytest.mark.parametrize("setting", [{"gamma": 0.9}, {"lam": 1.0}, {"whiten_advantages": False},
                                     {"vf_coef": 0.5}, {"clip_range_value": 0.1},
                                     {"value_model": "separate"}, {"kl_estimator": "k3"}])
def test_grpo_refuses_the_settings_only_ppo_reads(setting):
    (name, value), = setting.items()
    with pytest.raises(ConfigError, match=f"algo=grpo ignores {name}={value!r}"):
        PpoConfig(algo="grpo", micro_batch_size=4, **setting)
    PpoConfig(algo="ppo", micro_batch_size=4, **setting)  # ppo reads it


def test_each_algo_names_every_setting_it_would_ignore():
    with pytest.raises(ConfigError, match="algo=grpo ignores gamma=0.9, kl_estimator='k3'"):
        PpoConfig(algo="grpo", micro_batch_size=4, gamma=0.9, kl_estimator="k3")
    with pytest.raises(ConfigError, match="algo=ppo ignores loss_type='grpo', scale_rewards='none'"):
        PpoConfig(algo="ppo", micro_batch_size=4, loss_type="grpo", scale_rewards="none")


def test_separate_value_model_trains_its_own_trunk_and_leaves_the_policy_alone(tmp_path):
    from llmkit.model.reward_model import RewardModel

    torch.manual_seed(1)
    rm = RewardModel(Transformer(ModelConfig(vocab_size=12, hidden_size=32, n_layers=1, n_heads=2,
                                             n_kv_heads=1, intermediate_size=64, max_seq_len=16,
                                             tie_embeddings=False)))
    policy = tiny_setup(tie_embeddings=False)[0].model.policy
    started = build_actor_critic(policy, PpoConfig(value_model="separate", micro_batch_size=8), rm)
    # InstructGPT's start: the value model is a copy of the reward model, head included
    assert started.value_trunk is not rm.trunk
    for name, value in rm.state_dict().items():
        mine = started.value_head.weight if name == "score.weight" else started.value_trunk.state_dict()[name]
        assert torch.equal(mine, value), name
    ids = torch.randint(1, 12, (2, 9))
    _, values = started(ids, torch.ones_like(ids), 3)
    values.sum().backward()  # the value loss: no gradient reaches the policy
    assert all(p.grad is None for p in started.policy.parameters())

    task, cfg = tiny_setup(value_model="separate", tie_embeddings=False, max_steps=8)
    before = {k: v.detach().clone() for k, v in task.model.named_parameters()}
    Engine(tmp_path / "run", cfg.train_config(), task).fit()
    after = dict(task.model.named_parameters())
    frozen = sorted(k for k, v in after.items() if not v.requires_grad)
    assert frozen == ["value_trunk.lm_head.weight"]  # a value trunk never predicts tokens
    unchanged = sorted(k for k in before if torch.equal(before[k], after[k]))
    assert unchanged == frozen


# ---- the make fragment ----------------------------------------------------------------------------


def test_make_fragment_runs_ppo_on_its_inputs(tmp_path):
    for name in ("sft", "prompts_train", "rm", "prompts_eval"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
    verify = make_command(tmp_path, "ppo")
    assert verify == f"llmkit ppo --from sft --in prompts_train -w {tmp_path}"
    with_rm = make_command(tmp_path, "ppo", "PPO_REWARD=rm", "PPO_EVAL=prompts_eval",
                           "PPO_FLAGS=--set algo=grpo")
    assert with_rm == (f"llmkit ppo --from sft --in prompts_train --reward rm --eval prompts_eval "
                       f"-w {tmp_path} --set algo=grpo")


def test_make_fragment_waits_for_the_reward_model(tmp_path):
    for name in ("sft", "prompts_train"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
    out = make_dry_run(tmp_path, "ppo", "PPO_REWARD=rm", check=False)
    assert out.returncode != 0 and "rm/manifest.json" in out.stderr


# ---- the stage ----------------------------------------------------------------------------------


def prompt_rows(n: int, start: int = 0) -> list[dict]:
    return [{"id": f"q{start + i}", "prompt": r["prompt"], "answer": r["answer"]}
            for i, r in enumerate(preference_rows(n, seed=start))]


@pytest.fixture
def stage_ws(tmp_path, tok):
    from llmkit.model.reward_model import RewardModel

    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "sft", tiny_model(tok.vocab_size), tok)
    rm = RewardModel(tiny_model(tok.vocab_size, seed=1))
    write_checkpoint_run(ws, "rm", rm, tok, config=rm.checkpoint_config())
    write_dataset(ws, "prompts_train", prompt_rows(16))
    write_dataset(ws, "prompts_eval", prompt_rows(4, start=100))
    return ws


def run_stage(make_ctx, reward_model=None, policy="sft", eval_data="prompts_eval", out=None, **overrides):
    from llmkit.core.config import parse_overrides

    base = dict(max_steps=2, prompts_per_rollout=4, micro_batch_size=4, ppo_epochs=1,
                max_new_tokens=4, seq_len=64, eval_records=4, lr=1e-3, min_lr=1e-3)
    ctx = make_ctx(inputs=["prompts_train"], **({"out": out} if out else {}))
    ctx.overrides = parse_overrides([f"{k}={v}" for k, v in {**base, **overrides}.items()])
    return run_ppo(ctx, ctx.config(PpoConfig, "ppo"), policy=policy, reward_model=reward_model,
                   eval_data=eval_data)


@pytest.fixture(scope="module")
def answers_42(tok):
    """A policy that learnt by heart to answer 42 to "What is a+b?" whatever a and b are."""
    chats = [tok.encode_chat([{"role": "user", "content": f"What is {a}+{42 - a}?"},
                              {"role": "assistant", "content": "42"}])[0] for a in range(10, 18)]
    return memorizing_model(tok, chats, steps=40)


def test_stage_writes_a_policy_checkpoint_and_records_rewards_and_accuracy(make_ctx, stage_ws, tok,
                                                                         answers_42):
    """The policy answers 42 to every sum; half the held-out sums are 42 and the others 41 and 40
    (similarity 0.5 each), and two small steps do not change a greedy answer."""
    from llmkit.checkpoints.loading import load_model

    write_checkpoint_run(stage_ws, "sft42", answers_42, tok)
    write_dataset(stage_ws, "sums_eval", [{"id": f"e{i}", "prompt": f"What is {a}+{b}?", "answer": str(a + b)}
                                          for i, (a, b) in enumerate([(30, 12), (25, 17), (30, 11), (25, 15)])])
    before, _ = load_model(stage_ws / "sft42")
    b = run_stage(make_ctx, reward_model="rm", policy="sft42", eval_data="sums_eval")
    stats = json.loads((stage_ws / "ppo" / "manifest.json").read_text())["stats"]
    assert stats["reward"] == "model" and stats["rollouts"] == 2 and stats["steps"] == 2
    assert stats["reward_start"] is not None and stats["reward_end"] is not None
    assert stats["base_accuracy"] == stats["accuracy"] == 0.5
    assert stats["base_similarity"] == stats["similarity"] == 0.75
    after, step_dir = load_model(stage_ws / "ppo")  # a plain policy: no value head inside
    assert all(not torch.equal(p, q) for p, q in zip(before.parameters(), after.parameters()))
    assert (step_dir / "tokenizer" / "tokenizer.model").is_file()
    records = [json.loads(line) for line in (stage_ws / "ppo" / "metrics.jsonl").open()]
    assert records[0]["kl"] == 0.0
    assert run_stage(make_ctx, reward_model="rm", policy="sft42", eval_data="sums_eval").up_to_date
    assert b.stats["train_prompts"] == 16


def test_stage_reward_mix_adds_the_weighted_verifiable_reward(make_ctx, stage_ws, monkeypatch):
    import llmkit.rewards.verify

    # every response verifies: the same first rollout scores exactly verify_weight more under mix
    monkeypatch.setattr(llmkit.rewards.verify, "verify_rewards", lambda responses, answers, partial=False:
                        [1.0] * len(responses))
    by_model = run_stage(make_ctx, reward_model="rm", reward="model", max_steps=1, eval_records=0)
    mixed = run_stage(make_ctx, reward_model="rm", reward="mix", verify_weight=0.5, max_steps=1,
                      eval_records=0, out="ppo_mix")
    assert (by_model.stats["reward"], mixed.stats["reward"]) == ("model", "mix")
    assert mixed.stats["reward_start"] == pytest.approx(by_model.stats["reward_start"] + 0.5, abs=1e-6)


def test_stage_grpo_with_the_verifiable_reward(make_ctx, stage_ws):
    b = run_stage(make_ctx, algo="grpo", group_size=2, prompts_per_rollout=2)
    assert b.stats["reward"] == "verify" and b.stats["algo"] == "grpo"
    assert b.stats["reward_start"] == 0.0  # an untrained model does not add up


@pytest.mark.skipif(missing_cpu_bf16() is not None, reason="needs a CPU that multiplies bf16")
def test_on_a_bf16_lora_base_the_kl_is_0_where_the_policy_is_its_reference(make_ctx, stage_ws, monkeypatch):
    """bf16 products make a last-bit difference of their inputs a visible one: the reference pass
    takes the training pass's ops (`cpu_kernels.training_ops`), so step 1's KL is 0, to the last bit."""
    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 1)  # the tiny model's base packed as SmolLM2's
    b = run_stage(make_ctx, algo="grpo", group_size=2, prompts_per_rollout=2, max_steps=1, kl_coef=0.1,
                  **{"lora.r": 4, "lora.base_products": "bf16"})
    assert b.stats["base_products"] == "bf16"
    assert [json.loads(line)["kl"] for line in (stage_ws / "ppo" / "metrics.jsonl").open()] == [0.0]


def test_stage_rloo_with_the_verifiable_reward_writes_a_plain_policy(make_ctx, stage_ws):
    from llmkit.checkpoints.loading import load_model

    b = run_stage(make_ctx, algo="rloo", group_size=2, prompts_per_rollout=2, normalize_advantages=True)
    assert b.stats["reward"] == "verify" and b.stats["algo"] == "rloo" and b.stats["rollouts"] == 2
    after, _ = load_model(stage_ws / "ppo")  # the policy alone: no value head was built
    assert not any("value" in name for name, _ in after.named_parameters())


def test_stage_grpo_with_partial_credit_records_held_out_similarity(make_ctx, stage_ws, tok, answers_42):
    write_checkpoint_run(stage_ws, "sft42", answers_42, tok)
    write_dataset(stage_ws, "sums_eval", [{"id": f"e{i}", "prompt": f"What is {a}+{b}?", "answer": str(a + b)}
                                          for i, (a, b) in enumerate([(30, 12), (25, 17), (30, 11), (23, 22)])])
    b = run_stage(make_ctx, algo="grpo", group_size=2, prompts_per_rollout=2, partial_credit=True,
                  policy="sft42", eval_data="sums_eval")
    for when in ("base_", ""):
        # "42" against 42, 42, 41 and 45: right twice, and half right (one digit of two) twice
        assert (b.stats[f"{when}accuracy"], b.stats[f"{when}similarity"]) == (0.5, 0.75)


def test_stage_lists_the_grpo_loss_types_and_refuses_ppo_settings_under_grpo(make_ctx, stage_ws):
    with pytest.raises(ConfigError, match="loss_type must be one of 'grpo', 'bnpo', 'dr_grpo', 'dapo'"):
        run_stage(make_ctx, algo="grpo", group_size=2, prompts_per_rollout=2, loss_type="seq_mean")
    with pytest.raises(ConfigError, match="algo=grpo ignores gamma=0.9"):
        run_stage(make_ctx, algo="grpo", group_size=2, prompts_per_rollout=2, gamma=0.9)


def test_stage_rejects_a_model_reward_without_a_reward_model(make_ctx, stage_ws):
    with pytest.raises(ConfigError, match="--reward RM"):
        run_stage(make_ctx, reward="model")


def test_stage_names_the_row_without_an_answer(make_ctx, stage_ws):
    rows = prompt_rows(4)
    rows[2]["answer"] = None
    write_dataset(stage_ws, "prompts_train", rows)
    with pytest.raises(UserError, match="'q2' has no `answer`"):
        run_stage(make_ctx)


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_zero2_with_accumulation_trains_like_zero0(tmp_path, algo):
    """ZeRO-3 is refused (rollouts sample from the whole policy); the sharded stage PPO runs on
    must not change what it learns."""
    with pytest.raises(ConfigError, match="zero_stage 0, 1 or 2"):
        tiny_setup(algo, zero_stage=3)
    curves = {}
    for stage in (0, 2):
        task, cfg = tiny_setup(algo, max_steps=2, grad_accum=2, micro_batch_size=4, zero_stage=stage)
        Engine(tmp_path / f"z{stage}", cfg.train_config(), task).fit()
        curves[stage] = [json.loads(line) for line in (tmp_path / f"z{stage}" / "metrics.jsonl").open()]
    assert curves[2][0]["grad_norm"] == pytest.approx(curves[0][0]["grad_norm"], rel=1e-5)
    assert curves[2][1]["loss"] == pytest.approx(curves[0][1]["loss"], rel=1e-5)
