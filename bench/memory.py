"""Benchmark: peak memory of one pretraining step, full logits vs the loss computed in chunks.

One forward + backward of llmkit's `small` preset with a 32k vocabulary at seq 1024 on CPU:
* full logits (before): `model(input_ids)` -> [B, T, vocab] float32 logits, then cross-entropy
  (what `PretrainTask.loss` did): the logits, their log-softmax and its gradient are all alive;
* chunked (after): `PretrainTask.loss`, i.e. `model(input_ids, targets=labels)`: the model makes
  `loss_chunk_size` positions' logits at a time and remakes them in backward.

Each variant runs in a fresh process (peak resident memory, `ru_maxrss`, only grows), and the
step's memory is that peak minus the resident memory just before the step (model, batch and
imports excluded). Variants alternate, `--repeats` times, so load changes fall on both alike.
Prints every run, then the median and spread (min-max) of each and of their ratio.

    python bench/memory.py [--batch 4] [--seq-len 1024] [--vocab 32000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench/tokenize.py would shadow the standard library's tokenize: take bench/ off the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

VARIANTS = ("full logits", "chunked")
MB = 2**20


def one_step(variant: str, batch: int, seq_len: int, vocab: int) -> dict:
    """Runs in the child process: build, measure resident memory, one forward + backward."""
    import os
    import resource

    import torch
    import torch.nn.functional as F

    from llmkit.model.transformer import Transformer
    from llmkit.model.config import model_config
    from llmkit.train.pretrain import PretrainTask

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = Transformer(model_config("small", vocab_size=vocab, max_seq_len=seq_len)).train()
    rows = torch.randint(0, vocab, (batch, seq_len + 1))
    step = {"input_ids": rows[:, :-1].contiguous(), "labels": rows[:, 1:].contiguous()}
    task = PretrainTask(model, None, None, seq_len=seq_len)
    with open("/proc/self/statm") as f:  # Linux, as ru_maxrss in kB is
        before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    if variant == "full logits":
        logits = model(step["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), step["labels"].flatten())
        del logits
    else:
        loss, _ = task.loss(model, step)
    loss.backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if peak <= peak_before:
        raise RuntimeError("building the model peaked above the step: the step's peak is not measured")
    return {"step_mb": (peak - before) / MB, "process_peak_mb": peak / MB, "loss": loss.item()}


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):,.0f} (min {min(values):,.0f}, max {max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                        help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_step(args.child, args.batch, args.seq_len, args.vocab)))
        return
    if args.quick:
        args.batch, args.seq_len, args.vocab, args.repeats = 1, 256, 8000, 1

    logits_mb = args.batch * args.seq_len * args.vocab * 4 / MB
    print(f"one pretrain step (forward + backward), preset small, batch {args.batch} x seq {args.seq_len}, "
          f"vocab {args.vocab:,} (float32 logits alone: {logits_mb:,.0f} MB), CPU")
    runs = {v: [] for v in VARIANTS}
    for repeat in range(args.repeats):
        for variant in VARIANTS:
            cmd = [sys.executable, __file__, "--child", variant, "--batch", str(args.batch),
                   "--seq-len", str(args.seq_len), "--vocab", str(args.vocab)]
            out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            runs[variant].append(out)
            print(f"run {repeat + 1} {variant:12s}: step {out['step_mb']:,.0f} MB, process peak "
                  f"{out['process_peak_mb']:,.0f} MB, loss {out['loss']:.4f}")
    before = [r["step_mb"] for r in runs["full logits"]]
    after = [r["step_mb"] for r in runs["chunked"]]
    ratios = [b / a for b, a in zip(before, after)]
    print(f"step memory before (full logits): {spread(before)} MB")
    print(f"step memory after (chunked):      {spread(after)} MB")
    print(f"before / after: median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}x, "
          f"max {max(ratios):.2f}x)")


if __name__ == "__main__":
    main()
