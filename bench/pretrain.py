"""Benchmark: llmkit's training engine against a plain Hugging Face training loop.

Same model (llmkit's `small` preset, exported to `LlamaForCausalLM` with identical weights),
same batches, same AdamW settings, grad clipping and schedule, same process:
* llmkit: `Engine` (DeepSpeed ZeRO-0, fp32) with the pretraining loss; a step is timed from one
  batch request to the next, so the engine's logging and bookkeeping count;
* peer: `LlamaForCausalLM(input_ids).logits` + cross-entropy + `torch.optim.AdamW` (default
  settings) + clip_grad_norm_ + LambdaLR.

The two alternate step by step (the peer's step i runs inside llmkit's request for batch i),
so load changes on a shared machine fall on both alike. Prints tokens per wall-clock second
and per CPU second of both and their ratios, the losses of both (same weights and batches:
they agree), and llmkit's MFU against the measured fp32 matmul peak of this CPU. The first
steps (allocator and thread-pool warm-up) are not counted; checkpoint writing is skipped.

`--matrix` (bench/pretrain_gpu.sh) times llmkit alone on a GPU: presets x precision x
activation checkpointing -> tokens/s, MFU (peak from the GPU table) and peak memory.

    python bench/pretrain.py [--preset small] [--steps 8] [--batch 8] [--seq-len 128] [--compile]
    python bench/pretrain.py --matrix [--presets smol-135m:16 1b:4] [--seq-len 2048] [--steps 20]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench/tokenize.py would shadow the standard library's tokenize: take bench/ off the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

WARMUP = 2  # steps not timed (3 in --matrix)


def make_batches(vocab_size: int, steps: int, batch: int, seq_len: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    # a Zipf-like token distribution: realistic softmax targets, not uniform noise
    weights = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64)
    rows = torch.multinomial(weights, steps * batch * (seq_len + 1), replacement=True, generator=g)
    rows = rows.view(steps, batch, seq_len + 1)
    return [{"input_ids": r[:, :-1].contiguous(), "labels": r[:, 1:].contiguous()} for r in rows]


def clock() -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process)."""
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> tuple[float, float]:
    now = clock()
    return now[0] - start[0], now[1] - start[1]


def train_config(steps: int, batch: int, **overrides):
    from llmkit.train.config import TrainConfig

    return TrainConfig(max_steps=steps, micro_batch_size=batch, lr=3e-4, min_lr=3e-5,
                       warmup_steps=2, weight_decay=0.1, log_every=1, save_every=0, keep_last=1,
                       **overrides)


class TransformersLoop:
    """The peer: a plain transformers + torch.optim training loop, one step per call."""

    def __init__(self, hf_model, train_cfg):
        import torch

        from llmkit.train.config import lr_at

        self.model, self.cfg = hf_model, train_cfg
        decay = [p for p in hf_model.parameters() if p.dim() >= 2]
        no_decay = [p for p in hf_model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": train_cfg.weight_decay},
                                      {"params": no_decay, "weight_decay": 0.0}],
                                     lr=train_cfg.lr, betas=train_cfg.betas, eps=1e-8)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_at(s + 1, train_cfg) / train_cfg.lr)
        self.times, self.losses = [], []
        hf_model.train()

    def step(self, batch) -> None:
        import torch

        start = clock()
        logits = self.model(input_ids=batch["input_ids"]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                 batch["labels"].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.losses.append(loss.item())
        self.times.append(since(start))


def bench_llmkit(model, batches, train_cfg, seq_len: int, run_dir: Path, peer=None):
    """(per-step (wall, CPU) seconds, losses, engine) of llmkit's engine on `batches`; with a
    peer, its step on the same batch runs between two of ours (and is not in our time)."""
    from llmkit.train.engine import Engine
    from llmkit.train.metrics import read_metrics
    from llmkit.train.pretrain import PretrainTask

    times, started = [], []

    class TimedTask(PretrainTask):
        def next_batch(self, model):
            if started:
                times.append(since(started.pop()))
            batch = super().next_batch(model)
            if peer is not None:
                peer.step(batch)
            started.append(clock())
            return batch

    task = TimedTask(model, batches, None, seq_len)
    engine = Engine(run_dir, train_cfg, task, model_config=model.config)
    engine.save_checkpoint = lambda: None  # writing checkpoints is not what is timed
    with contextlib.redirect_stderr(io.StringIO()):  # the per-step console lines
        engine.fit()
    times.append(since(started.pop()))
    return times, [r["loss"] for r in read_metrics(run_dir)], engine


def tokens_per_s(times, tokens_per_step: int, warmup: int = WARMUP) -> tuple[float, float]:
    """Tokens per wall-clock second and per CPU second (medians over the timed steps)."""
    return tuple(tokens_per_step / statistics.median(t[i] for t in times[warmup:]) for i in (0, 1))


def compare_with_transformers(args) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmkit.hf.mapping import to_hf_config, to_hf_state_dict
    from llmkit.model.transformer import Transformer
    from llmkit.model.config import model_config
    from llmkit.train.metrics import measured_cpu_peak_flops

    def pair():
        torch.manual_seed(0)
        model = Transformer(cfg)
        hf = LlamaForCausalLM(LlamaConfig(**to_hf_config(cfg)))
        hf.load_state_dict(to_hf_state_dict(model), strict=False)
        hf.tie_weights()
        return model, TransformersLoop(hf, train_config(args.steps, args.batch))

    cfg = model_config(args.preset, max_seq_len=max(args.seq_len, 256))
    batches = make_batches(cfg.vocab_size, args.steps, args.batch, args.seq_len)
    tokens = args.batch * args.seq_len
    model, peer = pair()
    print(f"model {args.preset}: {model.num_parameters():,} parameters, batch {args.batch} x "
          f"{args.seq_len} tokens, {args.steps} steps ({WARMUP} untimed), "
          f"{torch.get_num_threads()} threads")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        times, losses, engine = bench_llmkit(model, batches, train_config(args.steps, args.batch),
                                             args.seq_len, Path(tmp) / "eager", peer)
        rows += [("llmkit engine (ZeRO-0, fp32)", tokens_per_s(times, tokens)),
                 ("transformers + torch AdamW", tokens_per_s(peer.times, tokens))]
        print(f"losses  llmkit {[round(x, 4) for x in losses]}\n"
              f"  transformers {[round(x, 4) for x in peer.losses]}")
        if args.compile:
            model, compiled_peer = pair()
            times = bench_llmkit(model, batches, train_config(args.steps, args.batch, compile=True),
                                 args.seq_len, Path(tmp) / "compiled", compiled_peer)[0]
            rows += [("llmkit engine, torch.compile", tokens_per_s(times, tokens)),
                     ("transformers (same run)", tokens_per_s(compiled_peer.times, tokens))]
    print(f"{'':32} {'tokens/s':>10} {'tokens/CPU-s':>13}")
    for name, (wall, cpu) in rows:
        print(f"{name:32} {wall:10,.0f} {cpu:13,.0f}")
    (ours_wall, ours_cpu), (peer_wall, peer_cpu) = rows[0][1], rows[1][1]
    print(f"ratio llmkit / transformers: {ours_wall / peer_wall:.2f}x wall clock, "
          f"{ours_cpu / peer_cpu:.2f}x CPU time (target >= 1.3x)")
    peak = measured_cpu_peak_flops()
    print(f"MFU: {100 * engine.flops_per_token * ours_wall / peak:.1f}% of the measured fp32 matmul "
          f"peak ({peak / 1e9:,.0f} GFLOP/s; {engine.flops_per_token / 1e6:.1f} MFLOP per token)")


def gpu_matrix(args) -> None:
    """llmkit alone on one GPU: every preset x precision x activation checkpointing."""
    import gc

    import torch

    from llmkit.model.transformer import Transformer
    from llmkit.model.config import model_config

    if not torch.cuda.is_available():
        sys.exit("--matrix needs a GPU")
    print(f"{torch.cuda.get_device_name()}; seq_len {args.seq_len}; {args.steps} steps "
          f"(3 untimed); ZeRO-{args.zero_stage}")
    print(f"{'preset':<10} {'batch':>5} {'precision':<9} {'act.ckpt':<8} {'tokens/s':>10} "
          f"{'MFU':>6} {'peak GiB':>9} {'loss':>7}")
    for spec in args.presets:
        preset, batch = spec.split(":")
        batch = int(batch)
        cfg = model_config(preset, max_seq_len=max(args.seq_len, 2048))
        batches = make_batches(cfg.vocab_size, args.steps, batch, args.seq_len)
        for precision in args.precisions:
            for checkpointing in (False, True):
                torch.manual_seed(0)
                model = Transformer(cfg)
                train_cfg = train_config(args.steps, batch, precision=precision,
                                         zero_stage=args.zero_stage, compile=args.compile,
                                         activation_checkpointing=checkpointing)
                torch.cuda.reset_peak_memory_stats()
                try:
                    with tempfile.TemporaryDirectory() as tmp:
                        times, losses, engine = bench_llmkit(model, batches, train_cfg,
                                                             args.seq_len, Path(tmp) / "run")
                    rate = tokens_per_s(times, batch * args.seq_len, warmup=3)[0]
                    mfu = engine.flops_per_token * rate / engine.peak_flops
                    peak = torch.cuda.max_memory_allocated() / 2**30
                    print(f"{preset:<10} {batch:>5} {precision:<9} {str(checkpointing):<8} "
                          f"{rate:>10,.0f} {100 * mfu:>5.1f}% {peak:>9.1f} {losses[-1]:>7.3f}",
                          flush=True)
                    del engine
                except torch.OutOfMemoryError:
                    print(f"{preset:<10} {batch:>5} {precision:<9} {str(checkpointing):<8} "
                          f"{'out of memory':>10}", flush=True)
                del model
                gc.collect()
                torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=None, help="default 8 (CPU), 20 (--matrix)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=None, help="default 128 (CPU), 2048 (--matrix)")
    ap.add_argument("--compile", action="store_true", help="also time llmkit with torch.compile")
    ap.add_argument("--matrix", action="store_true", help="GPU: llmkit alone, presets x settings")
    ap.add_argument("--presets", nargs="+", default=["smol-135m:16", "1b:4"],
                    help="--matrix: PRESET:MICRO_BATCH entries")
    ap.add_argument("--precisions", nargs="+", default=["bf16", "fp32"])
    ap.add_argument("--zero-stage", type=int, default=0)
    ap.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                    help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    args = ap.parse_args()
    if args.quick and not args.matrix:
        args.preset, args.steps, args.batch = "tiny", 4, 4

    import logging

    logging.getLogger("llmkit.train").setLevel(logging.ERROR)  # no "undertrained" warning
    if args.matrix:
        args.steps, args.seq_len = args.steps or 20, args.seq_len or 2048
        gpu_matrix(args)
    else:
        args.steps, args.seq_len = args.steps or 8, args.seq_len or 128
        compare_with_transformers(args)


if __name__ == "__main__":
    main()
