"""QLoRA SFT: llmkit's `lora.quant=nf4` against TRL's `SFTTrainer` + peft + bitsandbytes, and against
llmkit's own LoRA on a float base (CPU).

The set-up is bench/lora.py's (its inputs, rows, schedule, LoRA r=16 alpha=32 dropout 0.05 on
every block linear, fp32 compute, no activation checkpointing, step-end-to-step-end timing over
steps WARMUP+1..STEPS, `--reps` alternating repetitions, median [min-max]); the base is held in
nf4 with double quantisation on both sides: llmkit by `lora.quant=nf4`, TRL by loading the exported
model with `BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=float32)` and handing SFTTrainer the peft
config. Both sides use torch's AdamW (`--optim adamw8bit` puts both on bitsandbytes' AdamW8bit).

Memory, per run (its own process; torch, deepspeed, peft and bitsandbytes imported before the
baseline): `peak RSS` of the process, `training` that peak less the baseline, and `loop peak`: the
high-water mark of the training loop alone (Linux's VmHWM reset when the first step starts, after
the allocator handed freed memory back), less the baseline. llmkit's QLoRA run quantises its start
as it reads it and sets glibc's mmap threshold (`quant.unpool_large_allocations`); its LoRA run and
TRL keep glibc's defaults.

    python bench/qlora.py [--preset smol-135m] [--steps 12] [--batch 4] [--threads 1] [--reps 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# bench/ holds a tokenize.py, which would shadow the standard library's `tokenize` module
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"] + [str(REPO)]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402

from bench.lora import ALPHA, DROPOUT, FP32_NO_CKPT, MB, R, TARGETS, build_inputs, conversations, timed  # noqa: E402
from bench.steps import (child_main, llmkit_step_ends, load_warning, record_batches, repeat,  # noqa: E402
                         spawn, spread, step_end_timer)


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def reset_peak() -> None:
    """Hand freed memory back to the system and restart Linux's resident high-water mark."""
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")


def measured(run):
    """A child: imports, baseline resident memory, the run; its peaks (process and loop)."""
    def child(payload: dict) -> dict:
        import importlib
        import resource

        for name in ("deepspeed", "peft", "bitsandbytes"):
            importlib.import_module(name)
        baseline = status_bytes("VmRSS")
        result = run(payload)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {**result, "peak_mb": peak / MB, "training_mb": (peak - baseline) / MB,
                "loop_mb": (result.pop("loop_peak") - baseline) / MB}
    return child


def llmkit_child(payload: dict) -> dict:
    """llmkit's run (bench/steps.py), the engine's loop peak measured around `_train_loop`."""
    from llmkit.train.engine import Engine

    loop = Engine._train_loop
    peaks = []

    def measured_loop(self):
        reset_peak()
        try:
            loop(self)
        finally:
            peaks.append(status_bytes("VmHWM"))

    Engine._train_loop = measured_loop
    return {**llmkit_step_ends(payload), "loop_peak": peaks[0]}


def trl_child(p: dict) -> dict:
    import peft
    import torch
    from datasets import Dataset
    from transformers import (AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, PrinterCallback,
                              TrainerCallback)
    from trl import SFTConfig, SFTTrainer

    class LoopPeak(TrainerCallback):
        peak = 0

        def on_train_begin(self, *args, **kwargs):
            reset_peak()

        def on_train_end(self, *args, **kwargs):
            LoopPeak.peak = status_bytes("VmHWM")

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(p["hf_dir"], dtype=torch.float32, quantization_config=quantization,
                                                 device_map="cpu")
    tokenizer = AutoTokenizer.from_pretrained(p["hf_dir"])
    dataset = Dataset.from_list(conversations(p["steps"] * p["batch"]))
    peft_config = peft.LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=DROPOUT, target_modules=TARGETS,
                                  task_type="CAUSAL_LM")
    timer = step_end_timer()
    with tempfile.TemporaryDirectory() as out:
        config = SFTConfig(output_dir=out, per_device_train_batch_size=p["batch"], max_steps=p["steps"],
                           learning_rate=2e-4, lr_scheduler_type="cosine", warmup_steps=2,
                           weight_decay=0.0, max_grad_norm=1.0, logging_steps=1, save_strategy="no",
                           report_to="none", use_cpu=True, max_length=p["seq_len"], packing=False,
                           seed=0, dataloader_num_workers=0, disable_tqdm=True,
                           train_sampling_strategy="group_by_length",
                           optim="adamw_bnb_8bit" if p["optim"] == "adamw8bit" else "adamw_torch",
                           **FP32_NO_CKPT)
        trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                             peft_config=peft_config, callbacks=[timer, LoopPeak()])
        trainer.remove_callback(PrinterCallback)
        trainable = sum(q.numel() for q in trainer.model.parameters() if q.requires_grad)
        batches = record_batches(trainer)
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"ends": timer.ends, "cpu_ends": timer.cpu_ends, "batches": batches, "trainable": trainable,
            "first_loss": losses[0], "last_loss": losses[-1], "loop_peak": LoopPeak.peak}


CHILDREN = {"llmkit": measured(llmkit_child), "trl": measured(trl_child)}


def run_sft(ws: Path, a, out: str, quant: str) -> dict:
    settings = [f"max_steps={a.steps}", f"micro_batch_size={a.batch}", "lr=2e-4", "min_lr=0",
                "warmup_steps=2", "betas=[0.9,0.999]", "weight_decay=0", "log_every=1", "eval_every=0",
                "eval_records=0", "eval_fraction=0", f"seq_len={a.seq_len}", "packing=false",
                f"lora.r={R}", f"lora.alpha={ALPHA}", f"lora.dropout={DROPOUT}", "lora.target=all-linear",
                f"lora.quant={quant}", f"optim={a.optim}"]
    args = ["sft", "--from", "base", "--in", "sft_rows", "--out", out, "--force",
            *[x for s in settings for x in ("--set", s)]]
    run = spawn(__file__, "llmkit", {"args": args}, a.threads, ws)
    records = [json.loads(line) for line in (ws / out / "metrics.jsonl").open()]
    stats = json.loads((ws / out / "manifest.json").read_text())["stats"]
    return {**run, **timed(run, a), "trainable": stats.get("trainable_parameters"),
            "first_loss": records[0]["loss"], "last_loss": records[-1]["loss"]}


def run_trl(hf_dir: Path, a) -> dict:
    run = spawn(__file__, "trl", {"hf_dir": str(hf_dir), "steps": a.steps, "batch": a.batch,
                                  "seq_len": a.seq_len, "optim": a.optim}, a.threads)
    return {**run, **timed(run, a)}


RUNS = [("qlora", "llmkit sft QLoRA (nf4)"), ("lora", "llmkit sft LoRA (fp32 base)"),
        ("trl", "TRL SFTTrainer + peft + bitsandbytes nf4")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smol-135m")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--optim", default="adamw", choices=["adamw", "adamw8bit"])
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("payload", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                        help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    a = parser.parse_args()
    if a.child:
        return child_main(CHILDREN, a.child, a.payload)
    if a.quick:
        a.preset, a.steps, a.warmup, a.reps = "tiny", 4, 1, 1
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        hf_dir = build_inputs(ws, a.preset, a.steps * a.batch, a.threads)
        runs = {"qlora": lambda: run_sft(ws, a, "qlora", "nf4"), "lora": lambda: run_sft(ws, a, "lora", "none"),
                "trl": lambda: run_trl(hf_dir, a)}
        results, loads = repeat([(key, runs[key]) for key, _ in RUNS], a.reps)
    report(a, results, loads)


def report(a, results, loads) -> None:
    def column(key, field):
        return [r[key][field] for r in results]

    print(f"QLoRA SFT, preset {a.preset}, {a.batch} rows/step, seq_len {a.seq_len}, {a.steps} steps, fp32 "
          f"compute, optim {a.optim}, {a.threads} CPU threads, {a.reps} repetitions; LoRA r={R} alpha={ALPHA} "
          f"on every block linear; steps/s of steps {a.warmup + 1}-{a.steps}")
    for i, (r, (before, after)) in enumerate(zip(results, loads), 1):
        print(f"  rep {i}: load {before:.2f} -> {after:.2f}; steps/s " +
              ", ".join(f"{key} {r[key]['rate']:.2f}" for key in r))
    width = max(len(label) for _, label in RUNS)
    print(f"  {'median [min-max]':<{width}} {'steps/s':>19} {'peak RSS':>9} {'training':>9} {'loop peak':>10}  "
          "loss (rep 1)")
    for key, label in RUNS:
        first = results[0][key]
        print(f"  {label:<{width}} {spread(column(key, 'rate')):>19} "
              f"{statistics.median(column(key, 'peak_mb')):>6,.0f} MB {statistics.median(column(key, 'training_mb')):>6,.0f} MB "
              f"{statistics.median(column(key, 'loop_mb')):>7,.0f} MB  {first['first_loss']:.3f} -> {first['last_loss']:.3f}")
    ratios = [r["qlora"]["rate"] / r["trl"]["rate"] for r in results]
    print(f"  llmkit QLoRA steps/s / TRL's: {spread(ratios)}x; peak RSS {spread(column('qlora', 'peak_mb'), '{:,.0f}')} "
          f"vs {spread(column('trl', 'peak_mb'), '{:,.0f}')} MB; loop peak vs plain LoRA: "
          f"{spread([r['qlora']['loop_mb'] / r['lora']['loop_mb'] for r in results])}x")
    if warning := load_warning(loads, a.threads):
        print(warning)


if __name__ == "__main__":
    main()
