"""Direct preference optimisation (`llmkit dpo`): train a policy on preference pairs against a
frozen reference (Rafailov et al. 2023), with the IPO, cDPO, robust and reference-free variants,
and the two losses that need no reference model at all, ORPO and SimPO (`loss_type=orpo|simpo`):
no reference pass, no reference weights held, so `--ref` and `precompute_ref=false` are refused.

A completion's log-probability is the sum over its reply tokens (the mean for IPO, as its
authors specify): the reply and its end of turn, the tokens SFT learns. Text a chat template
writes after the end of turn is not the reply: TRL's DPOTrainer counts every token after the
rendered prompt, so with ChatML templates that put the newline after <|im_end|> outside any
{% generation %} block (Qwen2.5's, SmolLM2's) its log-probs hold that newline too, one token per
sequence that llmkit leaves out (tests/train/test_trl_parity.py asserts exactly this).

ORPO (Hong et al. 2024) and SimPO (Meng et al. 2024) score a reply by its mean per-token
log-prob, as TRL's ORPOTrainer and CPOTrainer do. ORPO's NLL term is the chosen replies' mean
per-token NLL over the reply tokens only, like `llmkit sft` and LLaMA-Factory: TRL's ORPOTrainer
(like the paper's code) takes it over the prompt tokens too, which would train the policy to write
prompts. The odds-ratio and SimPO terms themselves equal TRL's (tests/train/test_preference_losses.py).

By default the reference's log-probabilities are computed once, in one pass over the data
before training, and stored in the batches, so the reference model is not held in memory while
the policy trains (`precompute_ref=false` keeps it and recomputes per batch).
The reference is `--ref`, by default the starting checkpoint `--from`; under LoRA that is the
policy itself with its adapters disabled (`lora.adapters_disabled`), so no second model is held.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass
from typing import get_args

import torch

from llmkit.data.chat import fixed_batches, one_per_prompt
from llmkit.data.preferences import collate_pairs, require_dataset_kind
from llmkit.errors import ConfigError
from llmkit.dryrun import parameters, plan
from llmkit.checkpoints.loading import load_model, starting_weights
from llmkit.checkpoints.lora import adapters_disabled, adapters_of
from llmkit.model.cpu_kernels import training_ops
from llmkit.model.packed_linear import packed_linears
from llmkit.train.cpu_precision import base_products
from llmkit.train.losses import (NO_REFERENCE_LOSS_TYPES, PreferenceLossType, dpo_loss, orpo_loss,
                                 simpo_loss)
from llmkit.train.planning import (dense_attention_mask, lora_split, model_shape, post_training_plan, show,
                                   trunk_parameters, world_size)
from llmkit.train.posttrain import (GenerativeConfig, batch_stream, exact_match_scorer,
                                    exact_match_summary, labelled_token_logps, load_start,
                                    post_training_inputs, preference_data)
from llmkit.train.stage import Fit, fit_stage
from llmkit.train.task import Task, to_device


@dataclass
class DpoConfig(GenerativeConfig):
    micro_batch_size: int = 8  # preference pairs per forward (2x sequences)
    lr: float = 1e-5  # DPO moves a tuned policy a little; tiny models take more (recipes set it)
    min_lr: float = 1e-6  # learning rate at the end of the cosine decay
    loss_type: PreferenceLossType = "sigmoid"  # sigmoid | ipo | cdpo | robust | reference_free | orpo | simpo
    beta: float = 0.1  # β: strength of the pull towards the reference; orpo: λ, the weight of
    #                    the odds-ratio term; simpo: the reward scale β (TRL's ORPOConfig and
    #                    CPOConfig call both `beta`, 0.1 there too; the SimPO paper tunes β in 2–10)
    label_smoothing: float = 0.0  # ε: assumed share of flipped labels (cdpo, robust, simpo)
    precompute_ref: bool = True  # reference log-probs in one pass before training (frees it)
    rpo_alpha: float = 0.0  # weight of the chosen reply's per-token NLL in the loss (RPO; TRL's rpo_alpha)
    simpo_gamma: float = 0.5  # γ: SimPO's target reward margin (TRL's CPOConfig.simpo_gamma)
    cpo_alpha: float = 0.0  # weight of the chosen reply's per-token NLL under simpo (TRL's
    #                         CPOConfig.cpo_alpha, 1.0 there: CPO-SimPO; 0 is the SimPO paper's loss)

    def __post_init__(self):
        super().__post_init__()
        if self.loss_type not in get_args(PreferenceLossType):
            raise ConfigError(f"loss_type must be one of {', '.join(get_args(PreferenceLossType))}, "
                              f"got {self.loss_type!r}")
        if not self.beta > 0:
            raise ConfigError(f"beta must be > 0, got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.loss_type == "cdpo" and self.label_smoothing == 0:
            raise ConfigError("loss_type=cdpo needs label_smoothing > 0 (e.g. 0.1); with 0 it is "
                              "plain sigmoid DPO")
        if self.rpo_alpha < 0:
            raise ConfigError(f"rpo_alpha must be >= 0, got {self.rpo_alpha}")
        if self.loss_type in ("ipo", "orpo") and self.label_smoothing:
            raise ConfigError(f"label_smoothing applies to sigmoid, cdpo, robust and simpo, not "
                              f"{self.loss_type}; drop it")
        self.check_no_reference_settings()

    def check_no_reference_settings(self) -> None:
        """ORPO's and SimPO's own settings only with them; the reference's and RPO's not with them."""
        if self.cpo_alpha < 0:
            raise ConfigError(f"cpo_alpha must be >= 0, got {self.cpo_alpha}")
        if self.loss_type != "simpo":
            for key, unset in (("simpo_gamma", 0.5), ("cpo_alpha", 0.0)):
                if getattr(self, key) != unset:
                    raise ConfigError(f"{key} applies to loss_type=simpo only, not {self.loss_type}; "
                                      f"drop it" + ("" if key == "simpo_gamma" else
                                                    " (DPO's chosen-reply NLL is rpo_alpha)"))
        if self.loss_type not in NO_REFERENCE_LOSS_TYPES:
            return
        if not self.precompute_ref:
            raise ConfigError(f"precompute_ref=false holds a reference model, and loss_type="
                              f"{self.loss_type} uses none; drop the setting")
        if self.rpo_alpha:
            raise ConfigError(f"rpo_alpha does not apply to {self.loss_type}: " + (
                "ORPO's loss holds the chosen replies' NLL already; drop it" if self.loss_type == "orpo"
                else "SimPO's chosen-reply NLL weight is cpo_alpha (TRL's CPOConfig name); use that"))

    @property
    def uses_reference(self) -> bool:
        return self.loss_type not in ("reference_free", *NO_REFERENCE_LOSS_TYPES)

    @property
    def average_logps(self) -> bool:
        return self.loss_type in ("ipo", *NO_REFERENCE_LOSS_TYPES)

    @property
    def chosen_nll_weight(self) -> float:
        """Weight of the chosen replies' per-token NLL added to the preference loss."""
        return {"orpo": 1.0, "simpo": self.cpo_alpha}.get(self.loss_type, self.rpo_alpha)


def completion_sums(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's (sum of reply-token log-probabilities, number of reply tokens): [2B] each."""
    logps, rows, _ = labelled_token_logps(model, batch["input_ids"], batch["labels"])
    n_rows = batch["input_ids"].shape[0]
    total = torch.zeros(n_rows, dtype=logps.dtype, device=logps.device).index_add(0, rows, logps)
    return total, torch.bincount(rows, minlength=n_rows)


def completion_logps(model, batch: dict, average: bool = False) -> torch.Tensor:
    """Sum (or mean) of each row's reply-token log-probabilities: [2B] for a pair batch."""
    return per_row(*completion_sums(model, batch), average)


def per_row(total: torch.Tensor, count: torch.Tensor, average: bool) -> torch.Tensor:
    return total / count.clamp(min=1) if average else total


@torch.no_grad()
def precompute_reference_logps(reference, pairs: list, pad_id: int, batch_size: int,
                               average: bool) -> None:
    """Give each pair its reference (chosen, rejected) completion log-probs, in one pass."""
    device = next(reference.parameters()).device
    was_training = reference.training
    reference.eval()
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        batch = to_device(collate_pairs([pairs[i] for i in chunk], pad_id), device)
        logps = completion_logps(reference, batch, average).tolist()
        for j, i in enumerate(chunk):
            pairs[i].ref_logps = (logps[j], logps[len(chunk) + j])
    reference.train(was_training)


class DpoTask(Task):
    """The DPO family's loss of (chosen, rejected) completion log-probs against the reference's
    (ORPO's and SimPO's of the policy's alone)."""

    perplexity = False  # a preference loss: exp(val_loss) is no perplexity

    def __init__(self, model, train_data, eval_data, cfg: DpoConfig, reference=None,
                 reference_seconds: float = 0.0):
        super().__init__(model, train_data, eval_data)
        self.cfg = cfg
        # held only when its log-probs are not precomputed; None then means the policy's own frozen
        # base (LoRA: the adapters disabled)
        self.reference = reference
        self.reference_seconds = reference_seconds  # time the precomputed log-probs took

    def reference_logps(self, model, batch):
        if not self.cfg.uses_reference:
            return None
        if "ref_logps" in batch:
            return batch["ref_logps"]
        return reference_output(self.reference, model, self.device,
                                lambda m: completion_logps(m, batch, self.cfg.average_logps))

    def pair_losses(self, model, batch, chosen, rejected):
        """(per-pair losses, chosen rewards, rejected rewards) of the configured loss."""
        cfg = self.cfg
        if cfg.loss_type == "orpo":
            return orpo_loss(chosen, rejected, lam=cfg.beta)
        if cfg.loss_type == "simpo":
            return simpo_loss(chosen, rejected, beta=cfg.beta, gamma=cfg.simpo_gamma,
                              label_smoothing=cfg.label_smoothing)
        ref = self.reference_logps(model, batch)
        return dpo_loss(chosen, rejected, None if ref is None else ref[:len(chosen)],
                        None if ref is None else ref[len(chosen):], beta=cfg.beta,
                        loss_type=cfg.loss_type, label_smoothing=cfg.label_smoothing)

    def loss(self, model, batch):
        cfg = self.cfg
        total, count = completion_sums(model, batch)
        policy = per_row(total, count, cfg.average_logps)
        half = len(policy) // 2
        losses, chosen_rewards, rejected_rewards = self.pair_losses(model, batch, policy[:half],
                                                                    policy[half:])
        margins = chosen_rewards - rejected_rewards
        loss = losses.mean()
        metrics = {"rewards/chosen": chosen_rewards.mean(),
                   "rewards/rejected": rejected_rewards.mean(),
                   "rewards/margins": margins.mean(),
                   "rewards/accuracy": (margins > 0).float().mean(),
                   "logps/chosen": policy[:half].detach().mean(),
                   "logps/rejected": policy[half:].detach().mean()}
        if cfg.chosen_nll_weight:
            # a preference loss can lower the chosen reply's likelihood too while it widens the
            # margin; the NLL of the chosen tokens (RPO, CPO; ORPO's SFT term) holds it up
            nll = -(total[:half].sum() / count[:half].sum().clamp(min=1))
            loss = loss + cfg.chosen_nll_weight * nll
            metrics["nll"] = nll.detach()
        return loss + model.aux_loss, metrics

    def flops_per_token(self) -> float:
        return self.model.flops_per_token(self.cfg.seq_len)


def reference_output(reference, model, device, compute):
    """`compute(m)` without gradients, m being the reference: `reference` on the policy's device and
    in its dtype (as in ppo), or when None the policy `model` itself with its adapters disabled."""
    with torch.no_grad(), training_ops():  # the training pass's numbers to the last bit
        if reference is None:
            with adapters_disabled(model):
                return compute(model)
        reference.to(device, next(model.parameters()).dtype)
        return compute(reference)


def reference_policy(policy, ref_step, cfg, device, precompute):
    """(the reference a task holds — None when it is not needed, when `precompute(reference)` has
    put its log-probs into the data, or when it is the policy's own base under LoRA —, seconds the
    precomputation took). `ref_step` None: the starting policy. `cfg`: a DpoConfig or KtoConfig."""
    if not cfg.uses_reference:
        return None, 0.0
    own_base = ref_step is None and adapters_of(policy) is not None  # the adapters off: no copy
    reference = (load_model(ref_step, device)[0] if ref_step
                 else policy if cfg.precompute_ref or own_base else copy.deepcopy(policy))
    if not cfg.precompute_ref:
        return (None if own_base else reference.requires_grad_(False)), 0.0
    started = time.time()
    # in the dtype the policy trains in (DeepSpeed casts it so anyway): log π − log π_ref is then 0
    # at the first step (to the last bit: the training passes' ops and products), where fp32 reference
    # log-probs would differ by the weights' rounding
    reference.to(cfg.torch_dtype)
    with adapters_disabled(reference) if own_base else contextlib.nullcontext(), training_ops():
        with products_as_trained(reference, cfg, device) if own_base else contextlib.nullcontext():
            precompute(reference)
    return None, time.time() - started  # the reference is not held while the policy trains


def products_as_trained(base, cfg, device):
    """While held, a LoRA run's frozen base multiplies as the engine makes it multiply for the run
    (in `lora.base_products`' dtype, through packed copies)."""
    bf16 = base_products(cfg.lora.base_products, on_gpu=str(device).startswith("cuda")) == "bf16"
    return packed_linears(base, frozen_only=True, frozen_dtype=torch.bfloat16 if bf16 else torch.float32)


def dpo_task(policy, ref_step, data, cfg: DpoConfig, pad_id: int, dist) -> DpoTask:
    """The task of a run: its reference made ready, its batches sharded for this process."""
    reference, seconds = reference_policy(
        policy, ref_step, cfg, dist.device,
        lambda ref: precompute_reference_logps(ref, data.pairs + data.eval_pairs, pad_id,
                                               2 * cfg.micro_batch_size, cfg.average_logps))
    eval_batches = fixed_batches(data.eval_pairs, data.collate, cfg.micro_batch_size)
    return DpoTask(policy, batch_stream(data.pairs, data.collate, cfg, dist), eval_batches or None,
                   cfg, reference, seconds)


def dpo_stats(result, task: DpoTask) -> dict:
    return {"reference_seconds": round(task.reference_seconds, 2)}


def dpo_summary(stats: dict) -> list[tuple]:
    return [("final loss", stats["final_loss"]), ("reward margin", stats["reward_margin"]),
            *exact_match_summary(stats)]


DPO_METRICS = {"final_loss": "loss", "reward_margin": "rewards/margins",
               "reward_accuracy": "rewards/accuracy", "val_reward_accuracy": "val_rewards/accuracy"}


def refuse_unused_reference(cfg: DpoConfig, ref: str | None) -> None:
    if ref and not cfg.uses_reference:
        raise ConfigError(f"--ref {ref}: loss_type={cfg.loss_type} uses no reference model; drop "
                          f"--ref, or choose a loss that has one (sigmoid, ipo, cdpo, robust)")


def reference_run(ctx, cfg, ref: str | None, base_step):
    """(artifact, step folder) of --ref; (None, None) when it is the starting policy or absent."""
    refuse_unused_reference(cfg, ref)
    ref_art, ref_step = starting_weights(ctx.workspace, ref) if ref else (None, None)
    if ref_step is not None and ref_step.resolve() == base_step.resolve():
        return None, None  # the reference is the starting policy
    return ref_art, ref_step


def run_dpo(ctx, cfg: DpoConfig, base: str, ref: str | None = None, eval_data: str | None = None):
    """`llmkit dpo`: train checkpoint `base` on the preference pairs of --in (default
    pref_train) against reference `ref` (default: `base`)."""
    base_art, base_step, data_art, eval_art = post_training_inputs(ctx, "dpo", cfg, base, eval_data)
    require_dataset_kind([data_art, eval_art], "preference", "dpo")
    ref_art, ref_step = reference_run(ctx, cfg, ref, base_step)

    def prepare() -> Fit:
        policy, tokenizer = load_start(base_step, cfg)
        data = preference_data(tokenizer, data_art, eval_art, cfg)
        scored = one_per_prompt(data.heldout)[:cfg.eval_records]
        return Fit(lambda dist: dpo_task(policy, ref_step, data, cfg, tokenizer.pad_id, dist),
                   tokenizer.path, dpo_summary, model=policy, start=base_step, metrics=DPO_METRICS,
                   after=dpo_stats, score=exact_match_scorer(cfg, tokenizer, scored),
                   stats={**data.counts, "train_rows": len(data.train_rows),
                          "heldout_pairs": len(data.eval_pairs), "eval_records": len(scored)})

    return fit_stage(ctx, "dpo", cfg, [base_art, ref_art, data_art, eval_art], prepare)


def plan_dpo(ctx, cfg, base: str, ref: str | None, eval_data: str | None, stage: str = "dpo") -> None:
    """`dpo --dry-run`, and `kto --dry-run` (`stage`): the same models, completions for pairs."""
    refuse_unused_reference(cfg, ref)
    step_dir, notes, data_art, eval_art = post_training_plan(ctx, stage, cfg, base, eval_data)
    require_dataset_kind([data_art, eval_art], "preference" if stage == "dpo" else "feedback", stage)
    frozen = 0
    if cfg.uses_reference:
        ref_dir = starting_weights(ctx.workspace, ref)[1] if ref else step_dir
        if cfg.precompute_ref:
            notes.append(f"reference           {ref_dir}: log-probs computed in one pass "
                         "before training, not held while training")
        else:
            frozen = trunk_parameters(ref_dir)
    shape, _ = model_shape(step_dir)
    n, world = parameters(shape), world_size()
    pairs = cfg.micro_batch_size * cfg.grad_accum * world
    trainable, base = lora_split(shape, n, cfg)
    if base and not ref:
        frozen = 0  # LoRA: the reference is the frozen base itself, adapters disabled
    show(ctx, plan(stage, shape, trainable=trainable, total=trainable + base + frozen,
              unit="pairs" if stage == "dpo" else "completions (+ their mismatched pairs)",
              per_step=pairs, tokens_per_step=2 * pairs * cfg.seq_len, sequences=2 * cfg.micro_batch_size,
              seq_len=cfg.seq_len, cfg=cfg, world_size=world, frozen=base + frozen,
              saved=trainable if base else n,
              dense_mask=dense_attention_mask(), notes=notes))
