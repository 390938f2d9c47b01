"""Timing and batch accounting shared by the training benches (dpo, lora, grpo): one fresh process
per run, a wall-clock stamp at the end of every optimizer step, and the shape of every batch the
loss sees, on llmkit's side and on a transformers Trainer's alike.

Both sides are timed from step end to step end: llmkit when the engine writes a step's metrics
record (log_every=1), a Trainer in its `on_step_end` callback, so everything between two step ends
(fetching and collating the batch, the step, logging) counts on both. Each batch is recorded
where the loss receives it (llmkit: `Task.next_batch`; a Trainer: `compute_loss`) as
(rows, padded width, real tokens): rows x width are the positions the model computes, padding
included, which is the work a step does; a sampler that groups rows by length lowers it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# -- one fresh process per run --------------------------------------------------------------

def spawn(script: str | Path, kind: str, payload, threads: int, ws: Path | None = None) -> dict:
    """Run `script --child KIND PAYLOAD` (payload as JSON) with `threads` threads; its last
    stdout line, as JSON."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "BENCH_THREADS": str(threads)}
    if ws is not None:
        env["LLMKIT_WORKSPACE"] = str(ws)
    done = subprocess.run([sys.executable, str(script), "--child", kind, json.dumps(payload)],
                          env=env, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{kind} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def child_main(children: dict, kind: str, payload: str) -> None:
    """The child side of `spawn`: the threads, then the run, its result as the last line."""
    import logging

    import torch

    torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    logging.getLogger("transformers").setLevel(logging.ERROR)
    result = children[kind](json.loads(payload))
    print(json.dumps(result))


# -- llmkit's side ----------------------------------------------------------------------------

def llmkit_step_ends(payload) -> dict:
    """Run `llmkit ARGS` in this process (a training stage with log_every=1). `payload`: the
    arguments, or {"args": …, "random_batches": bool}. Returns {"ends": the wall-clock time at the
    end of each optimizer step, "cpu_ends": the process's CPU time then, "batches": [rows, width,
    real tokens] of each micro-batch}.

    random_batches: the length-bucketing sampler's sorting window cut to one batch, so each batch
    is a random draw of rows as a Trainer's default sampler makes (the padding of random batches)."""
    from llmkit.cli.app import main
    from llmkit.data import loader
    from llmkit.train.metrics import MetricsLog
    from llmkit.train.task import Task

    if isinstance(payload, list):
        payload = {"args": payload}
    ends, cpu_ends, batches = [], [], []
    write, next_batch, sampler = MetricsLog.write, Task.next_batch, loader.LengthBucketSampler

    def stamped(self, record):
        ends.append(time.perf_counter())
        cpu_ends.append(time.process_time())
        write(self, record)

    def recorded(self, model):
        batch = next_batch(self, model)
        batches.append([*map(int, batch["input_ids"].shape), self.batch_tokens(batch)])
        return batch

    class RandomBatches(sampler):
        def __init__(self, *args, max_batch_size=None, **kwargs):
            super().__init__(*args, max_batch_size=max_batch_size, window=max_batch_size, **kwargs)

    MetricsLog.write, Task.next_batch = stamped, recorded
    if payload.get("random_batches"):
        loader.LengthBucketSampler = RandomBatches
    try:
        main(list(payload["args"]))
    except SystemExit as e:
        if e.code:
            raise
    finally:
        MetricsLog.write, Task.next_batch, loader.LengthBucketSampler = write, next_batch, sampler
    return {"ends": ends, "cpu_ends": cpu_ends, "batches": batches}


# -- a transformers Trainer's side --------------------------------------------------------------

def step_end_timer():
    """A transformers TrainerCallback; its `ends` are the wall-clock times of each optimizer step's
    end, its `cpu_ends` the process's CPU time then."""
    from transformers import TrainerCallback

    class StepEnds(TrainerCallback):
        def __init__(self):
            self.ends, self.cpu_ends = [], []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())
            self.cpu_ends.append(time.process_time())

    return StepEnds()


def record_batches(trainer) -> list:
    """[rows, width, real tokens] of each batch `trainer.compute_loss` is given, from now on."""
    batches, compute_loss = [], trainer.compute_loss

    def recorded(model, inputs, *args, **kwargs):
        ids = inputs["input_ids"]
        real = int(inputs["attention_mask"].sum()) if "attention_mask" in inputs else ids.numel()
        batches.append([*map(int, ids.shape), real])
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = recorded
    return batches


# -- figures ------------------------------------------------------------------------------------

def rates(ends: list[float], warmup: int, steps: int, cycle: int = 1, extra_s: float = 0.0) -> dict:
    """Steps per second after the first `warmup` steps, from the step-end times `ends`:
    `rate`, the timed steps over their wall-clock time (end of step `warmup` to the end of the
    last), and `median_rate`, the steps of a cycle (`cycle` consecutive steps: one generation
    and its updates in GRPO) over the median time of the timed cycles, which a burst of other
    work on the machine shorter than half the run leaves alone. `extra_s` seconds per step are
    added to both (a one-time pass's share)."""
    if len(ends) != steps or (steps - warmup) % cycle:
        sys.exit(f"expected {steps} step ends in whole cycles of {cycle} after {warmup}, got {len(ends)}")
    seconds = ends[-1] - ends[warmup - 1]
    cycles = [ends[i + cycle] - ends[i] for i in range(warmup - 1, steps - 1, cycle)]
    return {"rate": (steps - warmup) / (seconds + extra_s * (steps - warmup)),
            "median_rate": cycle / (statistics.median(cycles) + extra_s * cycle),
            "window_s": seconds}


def cpu_rate(cpu_ends: list[float], warmup: int, steps: int) -> float:
    """Steps per CPU-second of the process over the same window as `rates`: at one thread, what
    other jobs on the machine change least (a descheduled process spends no CPU time)."""
    return (steps - warmup) / (cpu_ends[-1] - cpu_ends[warmup - 1])


def padding(batches: list, warmup: int, steps: int) -> dict:
    """The positions computed (rows x width, padding included) and the real tokens: per step over
    the timed window (steps warmup+1..steps, one micro-batch a step) and in all over the run."""
    if len(batches) != steps:
        sys.exit(f"expected one batch per step ({steps}), got {len(batches)}")
    padded = [rows * width for rows, width, _ in batches]
    real = [r for _, _, r in batches]
    timed = padded[warmup:]
    return {"padded_per_step": sum(timed) / len(timed), "real_per_step": sum(real[warmup:]) / len(timed),
            "padded_total": sum(padded), "real_total": sum(real), "padded_timed": sum(timed)}


def padding_line(name: str, p: dict, width: int) -> str:
    share = 1 - p["real_total"] / p["padded_total"]
    return (f"  {name:<{width}} {p['padded_per_step']:>9,.0f} {p['real_per_step']:>9,.0f} "
            f"{p['padded_total']:>10,} {p['real_total']:>10,} {share:>8.1%}")


def padding_header(width: int) -> str:
    return (f"  {'tokens computed (rows x padded width) vs real':<{width}} {'per step':>9} {'real':>9} "
            f"{'all steps':>10} {'real':>10} {'padding':>8}")


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """'median [min–max]' of values (the median alone for one value)."""
    median = fmt.format(statistics.median(values))
    if len(values) == 1:
        return median
    return f"{median} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def load_average() -> float:
    return os.getloadavg()[0]


def load_warning(loads: list[tuple[float, float]], threads: int) -> str | None:
    """A line saying the figures were taken with other jobs on the machine, when a 1-minute load
    average went past the cores (this bench's own runs account for up to `threads` of it)."""
    cores, worst = os.cpu_count() or 1, max(max(pair) for pair in loads)
    if worst <= cores + 0.5:
        return None
    advice = ("a run at threads = cores that meets them slows 10-20x: rerun on a quiet machine or "
              "with --threads 1" if threads > 1 else "rerun on a quiet machine")
    return (f"  WARNING: load average up to {worst:.2f} on {cores} cores: other jobs shared the CPU, "
            f"these are not quiet figures; {advice}")


def repeat(runs: list[tuple[str, callable]], reps: int) -> tuple[list[dict], list[tuple[float, float]]]:
    """Each repetition runs every (name, run) once, in the given order in even repetitions and
    reversed in odd ones (so drifting load weighs on both sides alike); the results by name, and
    the 1-minute load average before and after each repetition."""
    results, loads = [], []
    for rep in range(reps):
        before, out = load_average(), {}
        for name, run in (runs if rep % 2 == 0 else runs[::-1]):
            out[name] = run()
        results.append(out)
        loads.append((before, load_average()))
    return results, loads
