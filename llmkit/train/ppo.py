"""PPO, GRPO and RLOO (`llmkit ppo`): reinforcement learning of a policy from a reward on its own samples.

PPO (Schulman et al. 2017, as applied to language models by Ziegler et al. 2019 and InstructGPT):
each rollout samples responses from the current policy with the KV cache, scores them with
reward functions (`llmkit.rewards.plugins`: a reward model, exact match against the prompt's
answer, math, format, code, the user's own; penalised for a missing stop token, clipped,
normalised), adds a per-token KL penalty to the frozen reference (k1 or k3; fixed or adaptive β;
under LoRA the policy with its adapters disabled), and turns rewards into advantages with GAE
against a learnt value head (on the policy's trunk or its own), whitened. Several epochs of
minibatches then minimise the clipped policy loss plus the clipped value loss. GRPO (Shao et al.
2024) samples a group of responses per prompt instead, uses each score relative to its group as
the advantage of every token, and needs no value model; its KL to the reference is a k3 term in
the loss, and its policy loss and aggregation are TRL's `loss_type` (`train.grpo_losses`).
RLOO (Ahmadian et al. 2024, as TRL's RLOOTrainer) samples a group too, but treats a response as
one action: β times its summed k1 KL comes off its score, its advantage is that reward less the
mean of its siblings' (leave-one-out), and the clipped ratio is that of its whole log-probability.
A response no reward scored (all None) is left out of its group's baseline (advantage 0, TRL's) or the loss (ppo).

The file reads top to bottom: the engine Task (prompts, rollouts, minibatches, resume), then the
stage; the settings are `train.ppo_config`, each algorithm's advantages and loss `train.ppo_algorithms`,
the per-token maths `train.rl_losses`. Per-token tensors are [B, R] over the response tokens
(right-padded; `mask` 1 on real ones, the stop token that ends a response included).

Held-out prompts (--eval, else a stable share of --in) are answered greedily before and after
training: exact match in `stats.base_accuracy` and `stats.accuracy`, the mean similarity to the answer in
`stats.base_similarity` and `stats.similarity`; `stats.reward_start` / `reward_end`: the mean
training reward of the first and last tenth of the rollouts.
"""

from __future__ import annotations

import copy
import functools
from typing import Callable

import torch

from llmkit.dryrun import BYTES, human_bytes, parameters, plan
from llmkit.checkpoints.loading import starting_weights
from llmkit.model.cpu_kernels import training_ops
from llmkit.model.decode_weights import decoding_weights, effective_weights, forget_trained_copies
from llmkit.model.transformer import Transformer
from llmkit.rewards.plugins import reward_setup, trainer_state
from llmkit.train.actor_critic import ActorCritic, build_actor_critic, response_logprobs
from llmkit.checkpoints.lora import adapters_disabled, adapters_of
from llmkit.train.grpo_losses import STEP_TOKEN_LOSSES
from llmkit.train.losses import masked_mean
from llmkit.train.ppo_algorithms import add_advantages, algorithm_loss
from llmkit.train.rl_losses import (AdaptiveKLController, FixedKLController, RunningMoments, at_temperature,
                                    clip_scores, logprobs_and_entropy, logprobs_of, penalize_missing_stop)
from llmkit.train.planning import (dense_attention_mask, lora_split, model_shape, post_training_plan, show,
                                   trunk_parameters, world_size)
from llmkit.train.posttrain import evaluate_answers, heldout_split, load_start, post_training_inputs
from llmkit.train.ppo_config import PpoConfig
from llmkit.train.ppo_rewards import run_rewards
from llmkit.train.rollouts import (Prompt, Samples, ends_with_stop, mean_over_processes, rank_and_world,
                                   rollout_prompts, sample_responses, sampling_model, select_rows)
from llmkit.train.stage import Fit, fit_stage
from llmkit.train.tool_rollouts import (ToolSetup, sample_tool_responses, tool_accuracy, tool_inputs,
                                         tool_setup)
from llmkit.train.task import Task


class PpoTask(Task):
    """PPO / GRPO / RLOO as a task of the shared engine.

    `next_batch` serves minibatches of the current rollout and, when none is left, samples a new
    rollout from the current policy: `prompts_per_rollout` prompts (× group_size for grpo, rloo)
    in a seeded shuffled order, responses sampled with the KV cache, scored, and turned into
    advantages. Each rollout is used for `ppo_epochs` shuffled passes. `loss` is the clipped
    policy loss plus the clipped value loss (ppo) or the k3 KL to the reference (grpo), or that of
    whole responses alone (rloo), plus the MoE load-balancing loss. The engine takes grad_accum
    batches per optimizer step and the config makes that divide the micro-batches of a pass, so no
    step mixes two rollouts or passes; dapo's loss is a mean over the response tokens of the step
    (`items_in_batch`).

    Resume: the prompt position, β and reward statistics are checkpointed; a run resumed from a
    checkpoint taken mid-rollout starts the next rollout (exact when save_every is a multiple of
    the optimizer steps per rollout).
    """

    perplexity = False  # a policy-gradient loss: exp(val_loss) is no perplexity

    def __init__(self, model: ActorCritic, reference: Transformer | None, prompts: list[Prompt],
                 scorer: Callable, cfg: PpoConfig, *, stop_ids: list[int], pad_id: int,
                 decode: Callable[[list[int]], str], tools: ToolSetup | None = None):
        super().__init__(model)
        if not prompts:
            raise ValueError("PPO needs at least one prompt")
        # None: the policy's own frozen base is the reference (LoRA: its adapters disabled)
        self.reference = reference.eval().requires_grad_(False) if reference is not None else None
        self.prompts, self.scorer, self.cfg = prompts, scorer, cfg
        self.stop_ids, self.pad_id, self.decode = list(stop_ids), pad_id, decode
        self.tools = tools  # multi-turn rollouts calling them (train.tool_rollouts)
        self.kl_ctl = (AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
                       if cfg.adaptive_kl else FixedKLController(cfg.kl_coef))
        self.score_moments = RunningMoments()
        self.prompt_epoch, self.prompt_cursor = 0, 0
        self.rollouts_done = 0
        self.reward_history: list[float] = []  # mean raw score of every rollout
        self._rollout: dict | None = None
        self._pending: list[torch.Tensor] = []  # row indices of the minibatches still to serve
        # the first pass's own log-probs, kept for the later passes when no sampling pass made them
        self._first_pass_logprobs: torch.Tensor | None = None
        self._rows_kept = 0
        self._rollout_kl_coef = self.kl_ctl.value  # β of the current rollout's rewards / KL loss
        self._rollout_metrics: dict = {}
        self.rollout_weights = "fp32"  # the weights the last rollout sampled through (after any fallback)

    # -- batches --------------------------------------------------------------------------------

    def next_batch(self, model):
        if not self._pending:
            rollout = self.make_rollout(getattr(model, "module", model))
            self._start_rollout(rollout)
        rows = self._pending.pop(0)
        return {**select_rows(self._rollout, rows), ROLLOUT_ROWS: rows}

    def items_in_batch(self, batch) -> int | None:
        if self.cfg.algo == "grpo" and self.cfg.loss_type in STEP_TOKEN_LOSSES:
            return int(batch["response_mask"].sum())
        return None

    def _start_rollout(self, rollout: dict) -> None:
        cfg = self.cfg
        n, size = len(rollout["input_ids"]), cfg.micro_batch_size
        self._rollout = rollout
        self._pending = [rows for _ in range(cfg.ppo_epochs) for rows in torch.randperm(n).split(size)]
        later_passes_need_them = cfg.ppo_epochs > 1 and "logprobs" not in rollout
        self._first_pass_logprobs = (torch.zeros_like(rollout["response_mask"], dtype=torch.float32)
                                     if later_passes_need_them else None)
        self._rows_kept = 0

    def _next_prompts(self) -> list[Prompt]:
        """This process's prompts of the next rollout, each repeated samples_per_prompt times.
        All processes walk one seeded order and each takes its own slice of every block."""
        rank, world = rank_and_world()
        n = self.cfg.prompts_per_rollout
        mine = self._take_prompts(n * world)[rank * n:(rank + 1) * n]
        return [p for p in mine for _ in range(self.cfg.samples_per_prompt)]

    def _take_prompts(self, count: int) -> list[Prompt]:
        out = []
        while len(out) < count:
            order = torch.randperm(len(self.prompts), generator=torch.Generator().manual_seed(
                self.cfg.seed * 100_003 + self.prompt_epoch))
            take = order[self.prompt_cursor:self.prompt_cursor + count - len(out)]
            out += [self.prompts[i] for i in take.tolist()]
            self.prompt_cursor += len(take)
            if self.prompt_cursor == len(self.prompts):
                self.prompt_epoch, self.prompt_cursor = self.prompt_epoch + 1, 0
        return out

    def sample(self, policy: Transformer, prompts: list[Prompt]) -> Samples:
        """One response per prompt from `policy`, sampled with the rollout settings, through the
        weights of decode.weights (the sampling alone: what scores the samples stays fp32)."""
        sample = functools.partial(sample_tool_responses, setup=self.tools) if self.tools else sample_responses
        self.rollout_weights = effective_weights(policy, self.cfg.decode.weights)
        # a full fine-tune's weights change every step, so each rollout converts them again, as a LoRA
        # policy's merged copy (without one its base is converted once: decoding_weights keeps it)
        forget_trained_copies(policy)
        with decoding_weights(sampler := sampling_model(policy), self.rollout_weights):
            return sample(sampler, prompts, max_new_tokens=self.cfg.max_new_tokens,
                          temperature=self.cfg.temperature, stop_ids=self.stop_ids, pad_id=self.pad_id,
                          decode=self.decode, device=self.device or torch.device("cpu"))

    @torch.no_grad()
    def make_rollout(self, module: ActorCritic) -> dict:
        """Sample, score and compute advantages for the next prompts; logs the rollout metrics."""
        cfg = self.cfg
        samples = self.sample(module.policy, self._next_prompts())
        ids, attn, P, mask = (samples.input_ids, samples.attention_mask, samples.prompt_len,
                              samples.response_mask)
        rollout = {"input_ids": ids, "attention_mask": attn, "prompt_len": P, "response_mask": mask}
        logprobs = values = ref_logprobs = None
        with training_ops():  # to the last bit what the training pass gives at these weights
            if self.needs_sampling_logprobs():
                logits, values = module(ids, attn, P)
                # log-probs of the distribution the responses were sampled from (logits / temperature,
                # as TRL does): otherwise the ratio and the KL describe a policy that never sampled them
                rollout["logprobs"] = logprobs = logprobs_of(at_temperature(logits, cfg.temperature),
                                                             samples.responses)
            if self.kl_ctl.value:  # β = 0: the reference cannot change the rewards, the loss or β
                rollout["ref_logprobs"] = ref_logprobs = self.reference_logprobs(module.policy, ids, attn, P)
        if hasattr(self.scorer, "state"):  # what reward functions read as trainer_state
            self.scorer.state = trainer_state(self.rollouts_done * cfg.steps_per_rollout, cfg.max_steps)
        raw_scores = self.scorer(samples).to(ids.device, torch.float32)  # NaN: no reward scored it
        stopped = (samples.stopped if samples.stopped is not None
                   else ends_with_stop(samples.responses, mask, self.stop_ids))
        scores = clip_scores(penalize_missing_stop(raw_scores, stopped, cfg.missing_eos_penalty),
                             cfg.reward_clip)
        if cfg.normalize_reward:
            self.score_moments.update(scores[~scores.isnan()])
            scores = self.score_moments.normalize(scores)
        mask = add_advantages(rollout, cfg, scores, stopped, logprobs, ref_logprobs, values, self.kl_ctl.value)

        self.rollouts_done += 1
        scored = raw_scores[~raw_scores.isnan()]
        self.reward_history += [scored.mean().item()] if len(scored) else []
        self._rollout_kl_coef = self.kl_ctl.value
        self._rollout_metrics = {
            **getattr(self.scorer, "metrics", {}),  # each reward function's mean and Nones
            **(samples.metrics or {}),  # tool calls and their errors
            "kl_coef": self._rollout_kl_coef,
            "reward_mean": scored.mean().item() if len(scored) else float("nan"),
            "reward_std": scored.std().item() if len(scored) > 1 else 0.0,
            "response_length": mask.sum(-1).float().mean().item(),
            "rollouts": float(self.rollouts_done),
        }
        if logprobs is not None and ref_logprobs is not None:
            log_ratio = (logprobs - ref_logprobs) * mask
            self._rollout_metrics["kl"] = log_ratio.sum(-1).mean().item()  # k1 summed over each response
            # every process's KL and sample count: β must stay the same on every GPU
            pooled_kl, samples_everywhere = mean_over_processes(log_ratio.sum(-1))
            self.kl_ctl.update(pooled_kl, n_steps=samples_everywhere)
        return rollout

    def needs_sampling_logprobs(self) -> bool:
        """Whether a rollout needs its own no-grad pass for the sampling policy's log-probs (and
        ppo's values). Not when each pass over the rollout is one optimizer step (its micro-batches
        one step's grad_accum): the first pass's losses then run on the parameters that sampled, so
        the old log-probs are the loss's own, detached (TRL's num_iterations=1), and the later
        passes read those, kept (TRL makes the extra pass there) — unless RLOO's reward or
        adaptive β reads the KL at rollout time."""
        cfg = self.cfg
        one_step_per_pass = cfg.rollout_size == cfg.micro_batch_size * cfg.grad_accum
        kl_at_rollout = bool(self.kl_ctl.value) and (cfg.algo == "rloo" or cfg.adaptive_kl)
        return cfg.algo == "ppo" or not one_step_per_pass or kl_at_rollout

    def reference_logprobs(self, policy: Transformer, ids, attn, prompt_len: int):
        if self.reference is None:
            with adapters_disabled(policy):
                return response_logprobs(policy, ids, attn, prompt_len, self.cfg.temperature)
        self.reference.to(self.device or "cpu", next(policy.parameters()).dtype)
        return response_logprobs(self.reference, ids, attn, prompt_len, self.cfg.temperature)

    # -- loss -----------------------------------------------------------------------------------

    def loss(self, model, batch):
        cfg = self.cfg
        mask = batch["response_mask"]
        logits, values = model(batch["input_ids"], batch["attention_mask"], batch["prompt_len"])
        logits = at_temperature(logits, cfg.temperature)  # the sampling distribution, as in make_rollout
        logprobs, entropy = logprobs_and_entropy(logits, batch["input_ids"][:, batch["prompt_len"]:],
                                                 with_entropy_grad=bool(cfg.entropy_coef))
        entropy = masked_mean(entropy, mask)
        if "logprobs" in batch:
            old = batch["logprobs"]
        else:  # no sampling pass: the first pass runs on the sampling parameters (needs_sampling_logprobs)
            old = logprobs.detach()
            self._keep_first_pass_logprobs(batch, old)
        metrics = {"entropy": entropy.detach(), "approx_kl_old": masked_mean(old - logprobs.detach(), mask)}
        if "ref_logprobs" in batch and "kl" not in self._rollout_metrics:  # the rollout could not log it
            metrics["kl"] = ((old - batch["ref_logprobs"]) * mask).sum(-1).mean()  # the sampling policy's
        loss, algo_metrics = algorithm_loss(cfg, batch, logprobs, old, values, self._rollout_kl_coef)
        metrics.update(algo_metrics)
        # model.aux_loss: the MoE load-balancing loss of this forward (0 for a dense policy)
        loss = loss - cfg.entropy_coef * entropy + model.aux_loss
        return loss, {**metrics, **self._rollout_metrics}

    def _keep_first_pass_logprobs(self, batch, logprobs) -> None:
        """Note a first-pass micro-batch's log-probs; once every row has them, the rollout serves
        them as the old log-probs of its later passes."""
        kept = self._first_pass_logprobs
        if kept is None or ROLLOUT_ROWS not in batch:
            return
        rows = batch[ROLLOUT_ROWS].to(kept.device)
        kept[rows, :logprobs.shape[1]] = logprobs.to(kept.device, torch.float32)
        self._rows_kept += len(rows)
        if self._rows_kept == len(kept):
            self._rollout["logprobs"], self._first_pass_logprobs = kept, None

    def checkpoint_module(self, module: ActorCritic) -> Transformer:
        return module.policy  # the stage's output is a plain policy; the value head stays in ds/

    # -- resume ---------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"prompt_epoch": self.prompt_epoch, "prompt_cursor": self.prompt_cursor,
                "rollouts_done": self.rollouts_done, "kl_coef": self.kl_ctl.value,
                "score_moments": self.score_moments.state_dict(),
                "reward_history": list(self.reward_history)}

    def load_state_dict(self, state: dict) -> None:
        self.prompt_epoch, self.prompt_cursor = state["prompt_epoch"], state["prompt_cursor"]
        self.rollouts_done = state["rollouts_done"]
        self.kl_ctl.value = state["kl_coef"]
        self.score_moments.load_state_dict(state["score_moments"])
        self.reward_history = list(state["reward_history"])
        self._rollout, self._pending = None, []
        self._first_pass_logprobs = None


ROLLOUT_ROWS = "rollout_rows"  # a micro-batch's rows of its rollout


# ---- the stage -----------------------------------------------------------------------------------

def window_mean(values: list[float], first: bool) -> float | None:
    """Mean of the first (or last) tenth of `values`, at least one of them."""
    if not values:
        return None
    k = max(1, len(values) // 10)
    chunk = values[:k] if first else values[-k:]
    return sum(chunk) / len(chunk)


def answers_scorer(cfg: PpoConfig, tokenizer, records: list[dict]):
    """`score(model, dist) -> {"accuracy", "similarity"}` of greedy replies to `records`, on the
    main process alone (the others wait in the engine's setup), for `Fit.score`."""

    def score(model, dist):
        if not dist.is_main:
            return {"accuracy": None, "similarity": None}
        scores = evaluate_answers(model, tokenizer, records, cfg.max_new_tokens)
        tools = tool_setup(cfg, tokenizer)  # and the answers' math equivalence when the model may call them
        return {"accuracy": scores["exact_match"], "similarity": scores["similarity"],
                **({"tool_accuracy": tool_accuracy(model, tokenizer, records, tools, cfg.max_new_tokens)}
                   if tools else {})}

    return score


def ppo_task(policy: Transformer, cfg: PpoConfig, prompts: list[Prompt], scorer: Callable, tokenizer,
             reward_model=None) -> PpoTask:
    """The task of a run rewarded by `scorer` (llmkit.rewards.plugins.RewardScorer)."""
    # LoRA: the reference is the policy with its adapters disabled, no second copy of the base
    reference = None if adapters_of(policy) is not None else copy.deepcopy(policy)
    return PpoTask(build_actor_critic(policy, cfg, reward_model), reference, prompts, scorer, cfg,
                   stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id, decode=tokenizer.decode,
                   tools=tool_setup(cfg, tokenizer))


def ppo_stats(result, task: PpoTask) -> dict:
    return {"rollouts": task.rollouts_done, "rollout_weights": task.rollout_weights,
            "reward_start": window_mean(task.reward_history, first=True),
            "reward_end": window_mean(task.reward_history, first=False)}


def ppo_summary(s: dict) -> list[tuple]:
    def score(x):  # None: nothing held out, or the process held a ZeRO-3 shard of the policy
        return "n/a" if x is None else f"{x:.3f}"

    return [("rollouts", s["rollouts"]),
            ("reward", f"{s['reward_start']:.3f} -> {s['reward_end']:.3f} ({s['reward']})"),
            ("held-out exact match", f"{score(s['base_accuracy'])} -> {score(s['accuracy'])} "
                                     f"({s['eval_records']} rows)"),
            ("held-out similarity", f"{score(s['base_similarity'])} -> {score(s['similarity'])}"),
            *([("held-out with tools", f"{score(s['base_tool_accuracy'])} -> {score(s['tool_accuracy'])}")]
              if "tool_accuracy" in s else [])]


def run_ppo(ctx, cfg: PpoConfig, policy: str = "sft", reward_model: str | None = None, eval_data=None):
    """`llmkit ppo`: PPO, GRPO or RLOO of checkpoint `policy` on the prompts of --in (prompts_train)."""
    policy_art, start, prompts_art, eval_art = post_training_inputs(ctx, "ppo", cfg, policy, eval_data)
    rewards = run_rewards(ctx, cfg, reward_model)  # a missing reward file or function exits 2 here

    def prepare() -> Fit:
        model, tokenizer = load_start(start, cfg)
        scorer, rm = rewards.scorer(cfg, tokenizer, policy_art)
        train_rows, heldout = heldout_split(prompts_art, eval_art, cfg)
        prompts, dropped = rollout_prompts(tokenizer, train_rows, cfg.seq_len - cfg.max_new_tokens,
                                           prompts_art.path, needs_answer=rewards.setup.needs_answer)
        scored = [r for r in heldout if r.get("answer") is not None][:cfg.eval_records]
        return Fit(lambda dist: ppo_task(model, cfg, prompts, scorer, tokenizer, rm), tokenizer.path, ppo_summary,
                   model=model, start=start, model_config=model.config, after=ppo_stats,
                   score=answers_scorer(cfg, tokenizer, scored), metrics={"kl": "kl"},
                   stats={"reward": rewards.setup.shown, "algo": cfg.algo, "train_prompts": len(prompts),
                          "dropped_too_long": dropped, "heldout_rows": len(heldout), "eval_records": len(scored)})

    inputs = [policy_art, prompts_art, rewards.rm_art, eval_art, *rewards.files, *tool_inputs(cfg)]
    return fit_stage(ctx, "ppo", cfg, inputs, prepare)


def plan_ppo(ctx, cfg, policy: str, reward_model: str | None, eval_data: str | None) -> None:
    """`llmkit ppo --dry-run`: what run_ppo would do, from the inputs it would read."""
    step_dir, notes, _, _ = post_training_plan(ctx, "ppo", cfg, policy, eval_data)
    rm_dir = starting_weights(ctx.workspace, reward_model)[1] if reward_model else None
    rewards = reward_setup(cfg, rm_dir is not None)
    shape, _ = model_shape(step_dir)
    n, world = parameters(shape), world_size()
    rm_params = trunk_parameters(rm_dir) if rm_dir is not None and (
        rewards.needs_model or cfg.value_model == "separate") else 0
    trainable, base = lora_split(shape, n, cfg)
    saved = trainable
    if cfg.algo == "ppo":
        trainable += (rm_params or n) if cfg.value_model == "separate" else 0
        trainable += shape.hidden_size + 1  # the value head
    # the reference policy (under LoRA the frozen base itself, adapters disabled) + the reward model
    frozen = (base or n) + (rm_params if rewards.needs_model else 0)
    responses = cfg.micro_batch_size * cfg.grad_accum * world
    kv_cache = 2 * shape.n_layers * shape.kv_width * cfg.rollout_size * cfg.seq_len * BYTES[cfg.precision]
    notes.append(f"rollouts            {cfg.rollout_size} responses of up to {cfg.max_new_tokens} "
                 f"tokens each ({cfg.algo}, reward {rewards.shown}); their KV cache {human_bytes(kv_cache)}")
    show(ctx, plan("ppo", shape, trainable=trainable, total=trainable + frozen, unit="responses",
              per_step=responses, tokens_per_step=responses * cfg.seq_len,
              sequences=cfg.micro_batch_size * (2 if cfg.value_model == "separate" and cfg.algo == "ppo" else 1),
              seq_len=cfg.seq_len, cfg=cfg, world_size=world, frozen=frozen, saved=saved,
              loss_positions=cfg.micro_batch_size * cfg.max_new_tokens,
              dense_mask=dense_attention_mask(), notes=notes))
