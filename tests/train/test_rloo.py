"""RLOO (`llmkit ppo --set algo=rloo`) against TRL 1.16's RLOOTrainer, number for number, offline,
and in llmkit's own loop.

- advantages: RLOOTrainer._generate_and_score_completions (its generation, reward functions and
  log-prob passes stood in for) and llmkit's kl_penalized_scores + leave_one_out_advantages on the
  same rewards and per-token log-probs, with β = 0 and β ≠ 0 (the summed k1 KL off each reward),
  normalize_advantages off and on, an unscorable completion (NaN) and a group with one scorable;
- loss: RLOOTrainer._compute_loss and PpoTask.loss on the same logits (stand-in models), loss and
  gradient w.r.t. the logits; and on a tiny Llama and llmkit's copy, loss and weight gradients.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import transformers
from datasets import Dataset
from trl import RLOOConfig, RLOOTrainer

from llmkit.errors import ConfigError
from llmkit.train.actor_critic import ActorCritic
from llmkit.train.engine import Engine
from llmkit.train.rl_losses import kl_penalized_scores, leave_one_out_advantages
from llmkit.train.ppo import PpoConfig, PpoTask
from llmkit.train.rollouts import Prompt, ends_with_stop, response_mask_of, select_rows
from tests.tokenizers.test_tokenizer_json import GENERATION_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe
from tests.train.test_ppo import tiny_setup
from tests.train.test_trl_parity import (LLAMA, assert_close, assert_same_weight_grads, llmkit_copy,
                                         tiny_llama, trainer_args)

GROUP, PROMPT_LEN, RESPONSE_LEN, TEMPERATURE, ACCUM = 4, 3, 6, 0.7, 2
LENGTHS = [6, 2, 5, 1, 3, 6, 6, 4, 1, 2, 3, 4]  # completion tokens of three groups of four


def no_reward(completions, **_):
    return [0.0] * len(completions)


@pytest.fixture(scope="module")
def rloo(tmp_path_factory):
    folder = save_folder(tmp_path_factory.mktemp("tokenizer"), train_bpe(QWEN_SPECIALS),
                         GENERATION_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    args = trainer_args(RLOOConfig, tmp_path_factory, per_device_train_batch_size=GROUP,
                        gradient_accumulation_steps=ACCUM, num_generations=GROUP,
                        max_completion_length=8, temperature=TEMPERATURE, beta=0.0)
    trainer = RLOOTrainer(model=tiny_llama(5), reward_funcs=no_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["what is the"] * 8}),
                          processing_class=transformers.AutoTokenizer.from_pretrained(folder))
    trainer.model.train()
    return trainer


def response_mask(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()


# ---- advantages ---------------------------------------------------------------------------------

# a spread group; a group with one unscorable completion (NaN: every reward function gave None);
# a group with a single scorable completion (its baseline is 0/0: advantage 0, as the NaNs)
REWARDS = torch.tensor([0.0, 1.0, 1.0, 0.5,
                        2.0, float("nan"), -1.0, 3.0,
                        float("nan"), 0.7, float("nan"), float("nan")], dtype=torch.float64)


@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("normalize", [False, True])
def test_leave_one_out_advantages_equal_trls(rloo, monkeypatch, beta, normalize):
    """_generate_and_score_completions on the same rewards and per-token log-probs (old: the
    sampling policy's, ref: the reference's) gives the advantages kl_penalized_scores and
    leave_one_out_advantages give: β times each completion's summed log π_old − log π_ref off its
    reward, the mean of its scorable siblings' as its baseline, 0 where it cannot be scored."""
    n, width = len(LENGTHS), max(LENGTHS)
    mask = response_mask(LENGTHS, width)
    g = torch.Generator().manual_seed(1)
    old = -3 * torch.rand(n, width, generator=g, dtype=torch.float64)
    ref = old + 0.5 * torch.randn(n, width, generator=g, dtype=torch.float64)
    reference = torch.nn.Identity()  # stands in for the reference model: only its identity is read

    def logps(model, *_, **__):
        return (ref if model is reference else old), None, None

    monkeypatch.setattr(rloo, "beta", beta)
    monkeypatch.setattr(rloo, "normalize_advantages", normalize)
    monkeypatch.setattr(rloo, "ref_model", reference if beta else None)
    monkeypatch.setattr(rloo, "_generate", lambda prompts: (
        [[5, 6]] * n, [list(range(7, 7 + k)) for k in LENGTHS], ["x"] * n))
    monkeypatch.setattr(rloo, "_get_per_token_logps_and_entropies", logps)
    monkeypatch.setattr(rloo, "_calculate_rewards", lambda *_: REWARDS[:, None].clone())
    theirs = rloo._generate_and_score_completions([{"prompt": "p"}] * n)
    assert torch.equal(theirs["completion_mask"], mask)

    ours = leave_one_out_advantages(kl_penalized_scores(REWARDS, old, ref, mask, beta), GROUP, normalize)
    assert_close(ours, theirs["advantages"].to(ours.dtype))
    assert ours[[5, 8, 9, 10, 11]].abs().max() == 0  # unscorable, or alone in being scorable
    assert ours[[0, 1, 2, 3, 4, 6, 7]].abs().min() > 0


def test_the_baseline_leaves_the_sample_itself_out():
    """k/(k − 1) × (r − group mean): a group mean that includes the sample would be (r − mean)."""
    rewards = torch.tensor([0.0, 1.0, 1.0, 2.0, 5.0, 5.0, 5.0, 9.0])
    grouped = rewards.view(2, 4)
    expected = (grouped - grouped.mean(-1, keepdim=True)) * 4 / 3
    assert leave_one_out_advantages(rewards, 4).tolist() == pytest.approx(expected.view(-1).tolist())
    assert leave_one_out_advantages(rewards, 4)[0].item() == pytest.approx(0 - (1 + 1 + 2) / 3)


# ---- loss ---------------------------------------------------------------------------------------

class TrlGivenLogits(torch.nn.Module):
    """Stands in for the model in TRL's forward, whose fused LM head returns the per-token
    log-probs and entropies of the labelled tokens at its temperature: those of these logits."""

    def __init__(self, logits, tokens):
        super().__init__()
        self.logits, self.tokens = logits, tokens

    def forward(self, **_):
        log_probs = torch.log_softmax(self.logits / TEMPERATURE, -1)
        picked = log_probs.gather(-1, self.tokens[..., None])[..., 0]
        return SimpleNamespace(log_probs=picked, entropy=-(log_probs.exp() * log_probs).sum(-1),
                               aux_loss=None)


class GivenLogits(torch.nn.Module):
    """Stands in for llmkit's ActorCritic: these logits of the response columns, no value head."""

    def __init__(self, logits):
        super().__init__()
        self.logits, self.aux_loss = logits, torch.zeros((), dtype=logits.dtype)

    def forward(self, *_):
        return self.logits, None


def rloo_config(**settings) -> PpoConfig:
    return PpoConfig(**{"algo": "rloo", "group_size": GROUP, "prompts_per_rollout": ACCUM,
                        "micro_batch_size": GROUP * ACCUM, "temperature": TEMPERATURE,
                        "max_new_tokens": 8, **settings})


def rloo_task(actor, cfg: PpoConfig) -> PpoTask:
    return PpoTask(actor, None, [Prompt([1])], None, cfg, stop_ids=[], pad_id=0, decode=str)


@pytest.mark.parametrize("epsilon_high", [None, 0.28])
def test_rloo_loss_and_its_gradient_wrt_the_logits_equal_trls(rloo, monkeypatch, epsilon_high):
    """RLOOTrainer._compute_loss and PpoTask.loss on the same logits, old log-probs and
    advantages: one clipped ratio per completion, of its summed log-probs, averaged over the
    completions; the same loss and gradient w.r.t. every logit, with and without clip-higher."""
    g = torch.Generator().manual_seed(2)
    lengths = LENGTHS[:GROUP * ACCUM]
    B, vocab = len(lengths), 11
    mask = response_mask(lengths, RESPONSE_LEN)
    tokens = torch.randint(0, vocab, (B, RESPONSE_LEN), generator=g)
    logits = 2 * torch.randn(B, RESPONSE_LEN, vocab, generator=g, dtype=torch.float64)
    now = torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, tokens[..., None])[..., 0]
    old = now + 0.15 * torch.randn(B, RESPONSE_LEN, generator=g, dtype=torch.float64)
    advantages = torch.randn(B, generator=g, dtype=torch.float64)
    prompt = torch.ones(B, PROMPT_LEN, dtype=torch.long)

    monkeypatch.setattr(rloo, "epsilon_low", 0.2)
    monkeypatch.setattr(rloo, "epsilon_high", epsilon_high or 0.2)
    leaf = logits.clone().requires_grad_()
    theirs = rloo._compute_loss(TrlGivenLogits(leaf, tokens), {
        "prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": tokens,
        "completion_mask": mask, "old_logps": (old * mask).sum(-1), "advantages": advantages})
    their_grad, = torch.autograd.grad(theirs, leaf)

    leaf = logits.clone().requires_grad_()
    cfg = rloo_config(clip_range=0.2, clip_range_high=epsilon_high)
    batch = {"input_ids": torch.cat([prompt, tokens], 1), "attention_mask": torch.cat([prompt, mask], 1),
             "prompt_len": PROMPT_LEN, "response_mask": mask, "logprobs": old,
             "advantages": advantages[:, None]}
    ours, metrics = rloo_task(GivenLogits(leaf), cfg).loss(GivenLogits(leaf), batch)
    our_grad, = torch.autograd.grad(ours, leaf)

    assert_close(ours, theirs)
    assert_close(our_grad, their_grad)
    assert 0 < metrics["clipfrac"].item() < 1  # the clip is active on some completions, not all


def test_rloo_loss_and_weight_gradients_on_a_tiny_model_equal_trls(rloo):
    """A micro-batch through TRL's own policy (its fused, temperature-scaled head) and llmkit's
    copy of it: PpoTask.loss and RLOOTrainer._compute_loss, and their weight gradients."""
    actor = ActorCritic(llmkit_copy(rloo.model), with_value=False)
    g = torch.Generator().manual_seed(3)
    lengths = LENGTHS[:GROUP]
    B, vocab = len(lengths), LLAMA["vocab_size"]
    prompt = torch.randint(0, vocab, (B, PROMPT_LEN), generator=g)
    tokens = torch.randint(0, vocab, (B, RESPONSE_LEN), generator=g)
    mask = response_mask(lengths, RESPONSE_LEN)
    attention = torch.cat([torch.ones_like(prompt), mask], 1)
    with torch.no_grad():
        logits, _ = actor(torch.cat([prompt, tokens], 1), attention, PROMPT_LEN)
    now = torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, tokens[..., None])[..., 0]
    old = now + 0.1 * torch.randn(B, RESPONSE_LEN, generator=g)
    advantages = torch.randn(B, generator=g)

    theirs = rloo._compute_loss(rloo.model, {
        "prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": tokens,
        "completion_mask": mask, "old_logps": (old * mask).sum(-1), "advantages": advantages})
    cfg = rloo_config(micro_batch_size=GROUP, grad_accum=ACCUM)
    ours, _ = rloo_task(actor, cfg).loss(actor, {
        "input_ids": torch.cat([prompt, tokens], 1), "attention_mask": attention, "prompt_len": PROMPT_LEN,
        "response_mask": mask, "logprobs": old, "advantages": advantages[:, None]})
    assert_close(ours, theirs)
    assert_same_weight_grads(ours, actor.policy, theirs, rloo.model)


# ---- in llmkit's loop ---------------------------------------------------------------------------

def test_a_rollout_takes_each_responses_summed_kl_off_its_score_then_leaves_one_out():
    scores = torch.arange(16.0) % 5
    task, cfg = tiny_setup("rloo", scorer=lambda samples: scores, kl_coef=0.3, normalize_advantages=True)
    with torch.no_grad():  # the reference moves off the policy: KL ≠ 0
        for p in task.reference.parameters():
            p.add_(0.1 * torch.randn_like(p))
    rollout = task.make_rollout(task.model)
    mask = rollout["response_mask"]
    kl = ((rollout["logprobs"] - rollout["ref_logprobs"]) * mask).sum(-1)
    assert kl.abs().min() > 1e-3
    expected = leave_one_out_advantages(scores - 0.3 * kl, 4, normalize=True)
    assert rollout["advantages"].shape == (16, 1)
    assert rollout["advantages"][:, 0].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    assert "values" not in rollout and not any(k.startswith("value") for k, _ in task.model.named_parameters())


def test_rloo_masks_truncated_completions_out_of_the_kl_and_the_loss():
    task, _ = tiny_setup("rloo", stop_ids=[3], mask_truncated_completions=True)
    rollout = task.make_rollout(task.model)
    responses = rollout["input_ids"][:, rollout["prompt_len"]:]
    stopped = ends_with_stop(responses, response_mask_of(responses, [3]), [3])
    assert 0 < stopped.sum() < len(stopped)  # both kinds in the rollout
    assert rollout["response_mask"][~stopped].sum() == 0 < rollout["response_mask"][stopped].sum()
    loss, _ = task.loss(task.model, select_rows(rollout, torch.arange(8)))
    loss.backward()
    assert torch.isfinite(loss)


def test_rloo_trains_end_to_end_and_moves_every_parameter(tmp_path):
    task, cfg = tiny_setup("rloo", max_steps=12)
    before = {k: v.detach().clone() for k, v in task.model.named_parameters()}
    Engine(tmp_path / "run", cfg.train_config(), task).fit()
    after = dict(task.model.named_parameters())
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged, unchanged
    assert not any(k.startswith("value_head.") for k in before)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert records[0]["kl"] == pytest.approx(0.0, abs=1e-6) and records[0]["clipfrac"] == 0.0
    assert "kl_loss" not in records[0] and "value_loss" not in records[0]
    history = task.reward_history  # the share of the toy reward's target token, 3 rollouts
    assert len(history) == 3 and history[-1] > history[0] + 0.2, history


NORMALIZE_ON_RANK = """
import functools, json, sys, torch
from llmkit.train.rl_losses import leave_one_out_advantages
from llmkit.train.rollouts import over_processes
rank, init = int(sys.argv[1]), sys.argv[2]
torch.distributed.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=2)
rewards = torch.tensor([[0.0, 1, 1, 3], [10.0, 20, 20, 50]][rank])
normalized = functools.partial(leave_one_out_advantages, group_size=2, normalize=True)
print(json.dumps(over_processes(normalized, rewards, pooled=True).tolist()))
torch.distributed.destroy_process_group()
"""


def test_normalize_advantages_pools_every_process_as_trl_normalises_the_generation_batch(tmp_path):
    """Each process's slice of the advantages normalised over every process's (rank 1's rewards
    spread 10× more: normalised alone, each process would get unit std)."""
    init = tmp_path / "init"
    ranks = [subprocess.Popen([sys.executable, "-c", NORMALIZE_ON_RANK, str(r), str(init)],
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    outputs = [json.loads(r.communicate(timeout=120)[0]) for r in ranks]
    assert [r.returncode for r in ranks] == [0, 0]
    everyone = leave_one_out_advantages(torch.tensor([0.0, 1, 1, 3, 10, 20, 20, 50]), 2, normalize=True)
    assert outputs[0] + outputs[1] == pytest.approx(everyone.tolist(), abs=1e-6)
    alone = leave_one_out_advantages(torch.tensor([0.0, 1, 1, 3]), 2, normalize=True)
    assert outputs[0] != pytest.approx(alone.tolist(), abs=1e-3)


# ---- settings -----------------------------------------------------------------------------------

@pytest.mark.parametrize("setting", [{"gamma": 0.9}, {"whiten_advantages": False}, {"vf_coef": 0.5},
                                     {"value_model": "separate"}, {"kl_estimator": "k3"},
                                     {"loss_type": "grpo"}, {"scale_rewards": "none"},
                                     {"kl_bias_correction": True}])
def test_rloo_refuses_by_name_the_settings_only_ppo_or_grpo_read(setting):
    (name, value), = setting.items()
    with pytest.raises(ConfigError, match=f"algo=rloo ignores {name}={value!r}"):
        rloo_config(**setting)


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_normalize_advantages_is_refused_outside_rloo(algo):
    with pytest.raises(ConfigError, match=f"algo={algo} ignores normalize_advantages=True .*algo=rloo"):
        PpoConfig(algo=algo, micro_batch_size=4, normalize_advantages=True)
    assert rloo_config(normalize_advantages=True, mask_truncated_completions=True).normalize_advantages


def test_rloo_needs_two_samples_per_prompt():
    with pytest.raises(ConfigError, match="algo=rloo compares responses within a group: group_size must be >= 2"):
        rloo_config(group_size=1, micro_batch_size=2)
