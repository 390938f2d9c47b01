"""Pretraining (`llmkit pretrain`): next-token prediction on token shards.

Batches come from `TokenLoader` (sources mixed by p ∝ tokens^mixture_temperature); the loss is
cross-entropy with optional label smoothing, plus the MoE load-balancing loss. Validation
reports the plain cross-entropy and perplexity of the `val` split. Everything else — ZeRO,
precision, schedule, checkpoints, resume, metrics — is the shared engine's.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmkit.checkpoints.step_folders import TOKENIZER
from llmkit.data.loader import TokenLoader, tokenizer_of
from llmkit.dryrun import Shape, parameters, plan
from llmkit.errors import ConfigError, UserError
from llmkit.model.config import ContextExtension, extended_max_seq_len, model_config
from llmkit.tokenizers.sentencepiece import same_tokenizer, tokenizer_file
from llmkit.train.config import TrainConfig
from llmkit.train.distributed import seed_everything, setup_distributed
from llmkit.checkpoints.loading import load_model
from llmkit.train.new_rows_only import TRAIN_ONLY, train_new_rows_only
from llmkit.train.planning import check_seq_len, dense_attention_mask, lora_split, model_shape, show, world_size
from llmkit.train.stage import Fit, fit_stage, run_start
from llmkit.train.task import Task


@dataclass
class ModelSection:
    """A preset of `llmkit.model.transformer` with any of its fields overridden; None keeps the preset's."""

    preset: str = "small"  # tiny | small | smol-135m | 1b | 3b (see llmkit.model.config.PRESETS)
    vocab_size: int | None = None  # None = the tokenizer's vocabulary
    hidden_size: int | None = None  # width of the residual stream
    n_layers: int | None = None  # transformer blocks
    n_heads: int | None = None  # query heads
    n_kv_heads: int | None = None  # key/value heads (fewer = grouped-query attention)
    head_dim: int | None = None  # width of one attention head; None = hidden_size // n_heads
    intermediate_size: int | None = None  # SwiGLU inner width (per expert for MoE)
    max_seq_len: int | None = None  # longest sequence the model handles (RoPE table size)
    rope_theta: float | None = None  # RoPE base frequency
    # with --from only these three apply (a context extension); the checkpoint fixes the rest
    rope_scaling: dict[str, Any] | None = None  # long-context RoPE ({rope_type: yarn, factor: 4, ...}: llmkit.model.rope);
    #                                             None = plain; with --from, None keeps the checkpoint's
    norm: str | None = None  # rmsnorm | layernorm
    norm_eps: float | None = None  # epsilon inside the norms
    sliding_window: int | None = None  # attention window; None = the preset's (full attention)
    tie_embeddings: bool | None = None  # share the embedding matrix with the output head
    attention_bias: bool | None = None  # bias on the q, k, v projections (Qwen2)
    qk_norm: bool | None = None  # RMSNorm over each head of q and k before RoPE (Qwen3)
    nope_layers: list[int] | None = None  # layers without RoPE (SmolLM3's NoPE layers); None = the preset's (none)
    layer_types: list[str] | None = None  # each layer's mixer: full_attention | linear_attention (Qwen3.5); None = all full
    rotary_fraction: float | None = None  # share of each head's dimensions RoPE rotates (Qwen3.5: 0.25)
    attention_output_gate: bool | None = None  # a sigmoid gate on attention's output (Qwen3.5)
    zero_centred_norm: bool | None = None  # norms scale by 1 + weight (Qwen3.5)
    linear_n_key_heads: int | None = None  # Gated DeltaNet query/key heads
    linear_n_value_heads: int | None = None  # Gated DeltaNet value heads
    linear_key_head_dim: int | None = None  # width of one Gated DeltaNet query/key head
    linear_value_head_dim: int | None = None  # width of one Gated DeltaNet value head
    linear_conv_kernel: int | None = None  # taps of the causal convolution before the delta rule
    n_experts: int | None = None  # 0 = dense MLP; >= 2 = mixture of experts
    experts_top_k: int | None = None  # experts per token (MoE)
    router_aux_loss_coef: float | None = None  # weight of the MoE load-balancing loss
    shared_expert_size: int | None = None  # inner width of the shared expert beside the routed ones (Qwen3.5-MoE); 0 = none
    init_std: float | None = None  # std of the normal weight init
    family: str | None = None  # Hugging Face model_type for export; None = from the features

    def __post_init__(self):
        self.build(vocab_size=self.vocab_size or 2)  # validates preset and fields now

    def build(self, vocab_size: int):
        """The ModelConfig: preset < these overrides; vocab_size when not overridden."""

        overrides = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                     if f.name != "preset" and getattr(self, f.name) is not None}
        overrides.setdefault("vocab_size", vocab_size)
        return model_config(self.preset, **overrides)


def context_extension(model: ModelSection) -> ContextExtension:
    """What of the model section applies to a run started with --from: its RoPE settings."""
    return ContextExtension(model.rope_scaling, model.max_seq_len, model.rope_theta)


@dataclass
class PretrainConfig(TrainConfig):
    """The engine's settings (flat: `--set lr=...`), the model, and what pretraining reads."""

    model: ModelSection = field(default_factory=ModelSection)  # architecture: a preset + overrides
    seq_len: int = 256  # tokens per training sequence
    mixture_temperature: float = 0.7  # source sampling p ∝ tokens^T: 1 proportional, 0 uniform
    mixture_weights: dict[str, float] | None = None  # explicit source weights (replace the temperature)
    mixture_stages: list[dict] | None = None  # [{step: N, weights: {source: w}}, ...]: after step N, sources in these proportions (e.g. a decay phase that upsamples code)
    label_smoothing: float = 0.0  # cross-entropy label smoothing (validation loss is unsmoothed)
    eval_every: int = 100  # validation on the val split every N steps (and at the end); 0 = never
    doc_masking: bool = False  # attention (and positions) stay inside each document packed into a sequence; off: a sequence attends across them
    train_only: str = "all"  # all | new_rows: only the embedding rows `llmkit extend-vocab` added train, the rest frozen bit for bit (stage 1 of the Chinese-LLaMA recipe; llmkit.train.new_rows_only)

    def __post_init__(self):
        super().__post_init__()
        if self.seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {self.seq_len}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.train_only not in TRAIN_ONLY:
            raise ConfigError(f"train_only must be one of {', '.join(TRAIN_ONLY)}, got {self.train_only!r}")
        if self.train_only == "new_rows" and self.lora.enabled:
            raise ConfigError("train_only=new_rows with LoRA: a LoRA run on an extended model trains the new "
                              "rows beside its adapters already; drop one of them")
        if self.mixture_temperature < 0:
            raise ConfigError(f"mixture_temperature must be >= 0, got {self.mixture_temperature}")
        for i, stage in enumerate(self.mixture_stages or []):
            if (not isinstance(stage, dict) or set(stage) != {"step", "weights"} or not isinstance(stage["step"], int)
                    or not 0 < stage["step"] < self.max_steps or not isinstance(stage["weights"], dict)):
                raise ConfigError(f"mixture_stages[{i}] must be {{step: N, weights: {{source: w}}}} with "
                                  f"0 < N < max_steps ({self.max_steps}), got {stage!r}")

    def stage_starts(self, world_size: int) -> list[tuple[int, dict[str, float]]]:
        """The mixture stages as (first sample, weights): a step draws grad_accum micro-batches
        of every rank."""
        per_step = self.grad_accum * world_size * self.micro_batch_size
        return [(stage["step"] * per_step, stage["weights"]) for stage in self.mixture_stages or []]


class PretrainTask(Task):
    """Causal LM loss on TokenLoader batches; validation on the val split in document order."""

    warn_undertrained = True

    def __init__(self, model, train_loader, val_loader, seq_len: int, label_smoothing: float = 0.0,
                 eval_batches: int = 20, document_end: int | None = None):
        super().__init__(model, train_loader)
        self.val_loader, self.seq_len = val_loader, seq_len
        self.label_smoothing, self.n_eval_batches = label_smoothing, eval_batches
        self.document_end = document_end  # doc_masking: the token that ends each document

    def documents(self, input_ids) -> dict:
        if self.document_end is None:
            return {}
        doc_ids, position_ids = packed_documents(input_ids, self.document_end)
        return {"doc_ids": doc_ids, "position_ids": position_ids}

    def loss(self, model, batch):
        # the model computes the loss in chunks: [B, T, vocab] float32 logits would be the largest
        # activation of the step (8.4 GB at the 1b shapes)
        ids = batch["input_ids"]
        loss = model(ids, targets=batch["labels"], label_smoothing=self.label_smoothing, **self.documents(ids))
        if self.model.config.n_experts:
            return loss + model.aux_loss, {"aux_loss": float(model.aux_loss.detach())}
        return loss, {}

    def eval_loss(self, model, batch):
        ids = batch["input_ids"]
        return model(ids, targets=batch["labels"], **self.documents(ids)), {}

    def eval_batches(self):
        if self.val_loader is None:
            return None
        return self.val_loader.eval_batches(self.n_eval_batches)

    def flops_per_token(self) -> float:
        return self.model.flops_per_token(self.seq_len)


def packed_documents(input_ids, end_id: int):
    """(doc_ids, position_ids) [B, T] of the documents packed into each row: a document begins
    after each `end_id` (the shards end every document with it), positions restart at 0 there."""
    import torch

    B, T = input_ids.shape
    begins = torch.zeros_like(input_ids, dtype=torch.long)
    begins[:, 1:] = (input_ids[:, :-1] == end_id).long()
    index = torch.arange(T, device=input_ids.device).expand(B, T)
    first = torch.where(begins.bool(), index, torch.zeros_like(index)).cummax(dim=1).values
    return begins.cumsum(dim=1), index - first


def document_end(tokens_art, cfg: PretrainConfig) -> int | None:
    """With doc_masking, the token that ends each document of the shards; else None."""
    if not cfg.doc_masking:
        return None
    end = tokens_art.manifest["stats"].get("eos_id")
    if end is None:
        raise UserError(f"{tokens_art.path} does not record the token that ends its documents "
                        "(eos_id); rebuild it with `llmkit tokenize` to train with doc_masking")
    return end


def require_tokens_of_the_run(step_dir: Path, tokenizer_dir: Path, tokens_dir: Path) -> None:
    """Continued pretraining must read tokens made by the tokenizer the weights were trained
    with: ids from another vocabulary would train silently on garbage."""
    ours = step_dir / TOKENIZER
    if tokenizer_file(ours) is not None and not same_tokenizer(ours, tokenizer_dir):
        raise ConfigError(f"{tokens_dir} was tokenized with {tokenizer_dir}, but {step_dir} was trained "
                          f"with another tokenizer ({ours}); tokenize the corpus with that tokenizer, "
                          "or train a new model without --from")


def pretrain_start(cfg: PretrainConfig, vocab_size: int, from_step, tokenizer_dir, tokens_dir):
    """The model a run starts from: --from's weights and architecture, else a fresh one of
    cfg.model (the same initial weights on every process); checked against the data."""
    from llmkit.model.transformer import Transformer

    seed_everything(cfg.seed)  # every rank builds the same initial weights
    if from_step is not None:
        from llmkit.model.rope import extend_context

        model, _ = load_model(from_step)
        require_tokens_of_the_run(from_step, tokenizer_dir, tokens_dir)
        extend_context(model, context_extension(cfg.model))
    else:
        model = Transformer(cfg.model.build(vocab_size))
    if cfg.train_only == "new_rows":
        train_new_rows_only(model, from_step)
    if model.config.vocab_size < vocab_size:
        raise ConfigError(f"the model's vocab_size ({model.config.vocab_size}) is smaller than the "
                          f"tokenizer's ({vocab_size}); drop model.vocab_size or raise it")
    if cfg.seq_len > model.config.max_seq_len:
        raise ConfigError(f"seq_len={cfg.seq_len} exceeds the model's max_seq_len="
                          f"{model.config.max_seq_len}; set model.max_seq_len or lower seq_len")
    return model


def token_loaders(tokens_art, cfg: PretrainConfig):
    """(train loader, validation loader or None when the val split holds less than one sequence)
    of this process."""
    dist = setup_distributed()
    loader_args = dict(seq_len=cfg.seq_len, micro_batch_size=cfg.micro_batch_size,
                       temperature=cfg.mixture_temperature, weights=cfg.mixture_weights,
                       seed=cfg.seed, rank=dist.rank, world_size=dist.world_size)
    train = TokenLoader(tokens_art.path, "train", **loader_args, stages=cfg.stage_starts(dist.world_size))
    val_tokens = tokens_art.manifest["stats"].get("splits", {}).get("val", {}).get("tokens", 0)
    val = TokenLoader(tokens_art.path, "val", **loader_args) if val_tokens > cfg.seq_len else None
    if val is None and cfg.eval_every and dist.is_main:
        print(f"warning: {tokens_art.path} has {val_tokens:,} validation tokens, fewer than one "
              f"sequence (seq_len={cfg.seq_len}): no validation loss will be measured; tokenize with "
              "a larger --set val_fraction=…", file=sys.stderr, flush=True)
    return train, val


def pretrain_summary(stats: dict) -> list[tuple]:
    val_ppl = stats["val_ppl"] if stats["val_ppl"] is not None else "none (no validation split)"
    return [("parameters", f"{stats['parameters']:,}"), ("tokens seen", f"{stats['tokens_seen']:,}"),
            ("final loss", stats["final_loss"]), ("val perplexity", val_ppl),
            ("checkpoint", stats["checkpoint"])]


PRETRAIN_METRICS = {"final_loss": "loss", "val_loss": "val_loss", "val_ppl": "val_ppl",
                    "tokens_per_s": "tokens_per_s", "mfu": "mfu"}


def start_stats(cfg: PretrainConfig, model, train) -> dict:
    """The parameters and the mixture, and with stages each stage's mixture, for the manifest."""
    stats = {"parameters": model.num_parameters(), "mixture": train.probabilities}
    if cfg.mixture_stages:
        stats["mixture_stages"] = [{"step": stage["step"], "mixture": p}
                                   for stage, (_, p) in zip(cfg.mixture_stages, train.stages[1:])]
    return stats


def pretrain_stats(result, task) -> dict:
    """Also the samples each source gave over the whole run (every rank's; a resumed run's steps
    before the kill included)."""
    return {"skipped_steps": result.skipped_steps, "checkpoint": str(result.checkpoint),
            "samples_by_source": task.train_data.state_dict()["counts"]}


def run_pretrain(ctx, cfg: PretrainConfig, from_: str | None = None):
    """`llmkit pretrain`: train a causal LM on the token shards of --in (default `tokens`) into
    the checkpoint run `pretrain`; --from starts from a checkpoint's weights and architecture."""
    tokens_art = ctx.input(default="tokens")
    tokenizer_art, tokenizer_dir = tokenizer_of(tokens_art, ctx.workspace)
    from_art, from_step = run_start(ctx, "pretrain", cfg, from_) if from_ is not None else (None, None)

    def prepare() -> Fit:
        model = pretrain_start(cfg, tokens_art.manifest["stats"]["vocab_size"], from_step,
                               tokenizer_dir, tokens_art.path)
        (train, val), end = token_loaders(tokens_art, cfg), document_end(tokens_art, cfg)
        task = PretrainTask(model, train, val, cfg.seq_len, cfg.label_smoothing, cfg.eval_batches, end)
        # the start is handed over only for LoRA: a `Fit.model` is moved to the device whole, where
        # ZeRO-3 would partition it straight from host memory; parameters are counted before ZeRO
        return Fit(lambda dist: task, tokenizer_dir, pretrain_summary, model_config=model.config,
                   model=model if cfg.lora.enabled else None, start=from_step, after=pretrain_stats,
                   stats=start_stats(cfg, model, train),
                   metrics=PRETRAIN_METRICS, extra={"from": str(from_step)} if from_step else {})

    return fit_stage(ctx, "pretrain", cfg, [tokens_art, tokenizer_art, from_art], prepare)


def plan_pretrain(ctx, cfg, from_: str | None) -> None:
    """`llmkit pretrain --dry-run`: what run_pretrain would do, from the inputs it would read."""
    tokens_art = ctx.input(default="tokens")
    tokenizer_of(tokens_art, ctx.workspace)  # the run needs it: a missing one is named now
    vocab = tokens_art.manifest["stats"]["vocab_size"]
    if from_ is not None:
        _, step_dir = run_start(ctx, "pretrain", cfg, from_)
        shape, config = model_shape(step_dir)
        max_seq_len = extended_max_seq_len(config["max_seq_len"], context_extension(cfg.model))
    else:
        model = cfg.model.build(vocab)
        shape, max_seq_len = Shape.of(model), model.max_seq_len
    n, world = parameters(shape), world_size()
    per_step = cfg.micro_batch_size * cfg.seq_len * cfg.grad_accum * world
    train_tokens = tokens_art.manifest["stats"].get("splits", {}).get("train", {}).get("tokens")
    notes = []
    if train_tokens:
        notes.append(f"input               {tokens_art.path}: {train_tokens:,} training tokens "
                     f"(vocabulary {vocab:,}), read {per_step * cfg.max_steps / train_tokens:.2f} "
                     "times over")
    check_seq_len(cfg, max_seq_len, "set model.max_seq_len or lower seq_len")
    if shape.vocab_size < vocab:
        raise ConfigError(f"the model's vocab_size ({shape.vocab_size}) is smaller than the "
                          f"tokenizer's ({vocab}); drop model.vocab_size or raise it")
    trainable, base = lora_split(shape, n, cfg)
    show(ctx, plan("pretrain", shape, trainable=trainable, total=trainable + base, unit="tokens",
              per_step=per_step, frozen=base, saved=trainable if base else None,
              tokens_per_step=per_step, sequences=cfg.micro_batch_size, seq_len=cfg.seq_len, cfg=cfg,
              world_size=world, chunked_loss=True, dense_mask=cfg.doc_masking and dense_attention_mask(),
              notes=notes))
