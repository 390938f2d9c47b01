"""The Engine's save and restore (torchtitan's checkpointer): a step folder written by every
process and marked complete last, and the newest whole one every process can load read back.

A step folder holds the weights as safetensors (a LoRA run: its adapters and trained heads only;
the frozen base is an input of the run, not its state), config.json, the tokenizer, DeepSpeed's
`ds/` (optimizer state and ZeRO shards) and trainer_state.json: the counters below, the train
config and each process's RNG and task state (its data position), so a resumed run logs the same
losses as one never stopped. The folder format itself is `llmkit.checkpoints.step_folders`; which run to
continue and when to start over is `train.checkpoint`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

from llmkit.checkpoints import step_folders as ckpt
from llmkit.errors import UserError
from llmkit.checkpoints import lora
from llmkit.train.distributed import barrier

log = logging.getLogger("llmkit.train")

# the Engine's progress a checkpoint carries besides weights, optimizer and task state
COUNTERS = ("step", "tokens_seen", "skipped_steps", "bad_streak", "metrics", "threads")


class Checkpointer:
    """Saves and restores one run's step folders. `model` is the DeepSpeed engine, `task` the
    trainer's Task (its `checkpoint_module` names what is saved), `adapters` the LoRA adapters
    (None: full weights)."""

    def __init__(self, run_dir: Path, cfg, dist, model, task, adapters, tokenizer_dir: Path | None,
                 model_config: dict):
        self.run_dir, self.cfg, self.dist = run_dir, cfg, dist
        self.model, self.task, self.adapters = model, task, adapters
        self.tokenizer_dir, self.model_config = tokenizer_dir, model_config
        self.saved_step: int | None = None
        if adapters is not None:
            _save_trained_state_only(model)

    # -- restore -------------------------------------------------------------------------------

    def resume(self) -> tuple[Path, dict] | None:
        """(step folder, COUNTERS) of the newest checkpoint every process loaded, or None (a
        fresh run). A folder DeepSpeed cannot read is skipped for the one before it."""
        for step_dir in self._agreed_candidates():
            try:
                counters = self._load(step_dir)
            except UserError:
                raise
            except Exception as e:  # a damaged ds/ folder: the previous checkpoint may be whole
                log.warning("skipping checkpoint %s: DeepSpeed could not load it (%s)", step_dir, e)
                counters = None
            if self._on_every_rank(counters is not None):
                self.saved_step = counters["step"]
                return step_dir, counters
        return None

    def _agreed_candidates(self) -> list[Path]:
        """The checkpoints every rank finds whole, newest first: ranks that resumed from different
        steps would train out of step and hang in their first collective."""
        import torch

        mine = list(ckpt.resume_candidates(self.run_dir, self.cfg.resume_from))
        if self.dist.world_size == 1:
            return mine
        everyone = [None] * self.dist.world_size
        torch.distributed.all_gather_object(everyone, [p.name for p in mine])
        shared = set.intersection(*map(set, everyone))
        return [p for p in mine if p.name in shared]

    def _on_every_rank(self, ok: bool) -> bool:
        import torch

        if self.dist.world_size == 1:
            return ok
        flag = torch.tensor([int(ok)], device=self.dist.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        return bool(flag.item())

    def _load(self, step_dir: Path) -> dict:
        state = json.loads((step_dir / ckpt.TRAINER_STATE).read_text(encoding="utf-8"))
        if state["world_size"] != self.dist.world_size:
            raise UserError(
                f"{step_dir} was written by {state['world_size']} processes, this run has "
                f"{self.dist.world_size}; resume with the same number, or start a new run from its "
                "weights (--from)")
        if self.adapters is not None:
            recorded = lora.read_config(step_dir).get(lora.LORA_KEY, {}).get("base_fingerprint")
            lora.check_same_base(step_dir, recorded, self.adapters.base_fingerprint, self.adapters.base)
        # every DeepSpeed read of the step folder (model, optimizer, ZeRO shards) goes through
        # its checkpoint engine: make those reads weights-only
        self.model.checkpoint_engine.load = ckpt.safe_torch_load
        load_path, _ = self.model.load_checkpoint(str(step_dir), tag=ckpt.DEEPSPEED,
                                                  load_optimizer_states=True,
                                                  load_lr_scheduler_states=False,
                                                  # a LoRA run's ds/ holds no frozen weights
                                                  load_module_strict=self.adapters is None)
        if load_path is None:
            raise RuntimeError("no DeepSpeed checkpoint found")
        mine = state["ranks"][self.dist.rank]
        self.task.load_state_dict(mine["task"])
        ckpt.set_rng_state(mine["rng"])
        older = {"metrics": {}, "threads": []}  # what a checkpoint written before these had
        return {k: state.get(k, older[k]) if k in older else state[k] for k in COUNTERS}

    # -- save ----------------------------------------------------------------------------------

    def save(self, counters: dict) -> Path:
        """Write step-%08d/ for `counters["step"]` (all processes take part), then mark it
        complete, point `latest` at it and prune to keep_last."""
        import torch

        step = counters["step"]
        step_dir = self.run_dir / ckpt.step_dir_name(step)
        if self.saved_step == step:
            return step_dir
        main = self.dist.is_main
        if main:
            shutil.rmtree(step_dir, ignore_errors=True)  # debris of a save killed earlier
            step_dir.mkdir(parents=True)
        barrier()
        tensors, tied = self._consolidated_weights()
        rank_state = {"rng": ckpt.rng_state(), "task": ckpt.to_json_safe(self.task.state_dict())}
        ranks = [rank_state]
        if self.dist.world_size > 1:
            ranks = [None] * self.dist.world_size
            torch.distributed.all_gather_object(ranks, rank_state)
        if main:
            if self.adapters is None:
                ckpt.save_weights(step_dir / ckpt.WEIGHTS, tensors, tied)
            else:
                lora.save_adapters(step_dir, tensors, self.adapters)
            _write_json(step_dir / ckpt.MODEL_CONFIG,
                        {**self.model_config, **lora.config_entry(step_dir, self.adapters)})
            _write_json(step_dir / ckpt.TRAINER_STATE, {
                "step": step, "tokens_seen": counters["tokens_seen"],
                "skipped_steps": counters["skipped_steps"], "bad_streak": counters["bad_streak"],
                "world_size": self.dist.world_size, "metrics": counters["metrics"],
                "threads": counters["threads"],
                "train_config": dataclasses.asdict(self.cfg), "ranks": ranks})
            if self.tokenizer_dir is not None:
                shutil.copytree(self.tokenizer_dir, step_dir / ckpt.TOKENIZER)
        # the frozen base is an input of the run, not its state: LoRA saves leave it out
        self.model.save_checkpoint(str(step_dir), tag=ckpt.DEEPSPEED, save_latest=False,
                                   exclude_frozen_parameters=self.adapters is not None)
        barrier()
        if main:
            ckpt.mark_complete(step_dir)
            ckpt.prune_checkpoints(self.run_dir, self.cfg.keep_last)
        barrier()
        self.saved_step = step
        return step_dir

    def _consolidated_weights(self) -> tuple[dict, dict]:
        """Full weights on rank 0 (ZeRO-3 gathers each parameter in turn; all ranks must call);
        only the trained ones (adapters, heads) of a model with LoRA adapters."""
        import deepspeed

        module = self.task.checkpoint_module(self.model.module)
        named = module.state_dict(keep_vars=True)
        if self.adapters is not None:
            named = {k: v for k, v in named.items() if v.requires_grad}
        tied = ckpt.tied_groups(named)
        out = {}
        for name, tensor in named.items():
            if name in tied:
                continue
            if hasattr(tensor, "ds_id"):  # a ZeRO-3 partition
                with deepspeed.zero.GatheredParameters([tensor]):
                    if self.dist.is_main:
                        out[name] = tensor.detach().cpu().clone()
            elif self.dist.is_main:
                out[name] = tensor.detach().cpu()
        return out, tied


def _save_trained_state_only(engine) -> None:
    """Make a DeepSpeed engine's checkpoints hold the trained parameters alone (a LoRA run's
    adapters and heads): its `exclude_frozen_parameters` keeps a frozen tied matrix under its
    second name (lm_head.weight), the largest matrix of a small model, in every step folder."""
    full_state = engine.module_state_dict
    trained = {name for name, p in engine.module.named_parameters(remove_duplicate=False) if p.requires_grad}

    def module_state_dict(*args, **kwargs):
        state = full_state(*args, **kwargs)
        for name in [k for k in state if k not in trained]:
            del state[name]
        return state

    engine.module_state_dict = module_state_dict


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, allow_nan=True) + "\n", encoding="utf-8")
