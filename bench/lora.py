"""LoRA SFT: llmkit's LoRA vs its full fine-tuning, and vs TRL's `SFTTrainer` + peft (CPU).

One random llmkit model of a preset (default `small`; `--preset smol-135m` for SmolLM2-135M's
shapes; the vocabulary is the tokenizer's, trained on the data) is exported with `llmkit
export`, so TRL trains the very same weights as a transformers `LlamaForCausalLM`, with the
same tokenizer and chat template, on the same SFT rows (the demo's `sft_train.jsonl`, one
conversation per sequence: no packing). Same steps, batch, sequence length, learning-rate
schedule (cosine, warmup 2), AdamW (β 0.9 / 0.999, no decay), fp32; LoRA r=16, α=32, dropout
0.05 on every linear layer of the blocks on both sides.

Each run is its own process, which imports torch, deepspeed and peft (so transformers) before
it starts: `peak RSS` is the process's peak resident memory, `training memory` that peak less
the resident memory after those imports (model, optimizer, activations; the imports are equal
for all runs). Step time is the median over the steps after the first (which warms up; the
median because other processes on a shared machine slow some steps): llmkit's `step_s` in
metrics.jsonl, TRL's from a callback around each optimizer step. Model loading, tokenisation and
process start are excluded.

    python bench/lora.py [--preset small] [--steps 20] [--batch 8] [--threads 2]
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
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from bench.dpo import write_random_run  # noqa: E402

ROWS = REPO / "recipes/demo/data/tasks/sft_train.jsonl"
R, ALPHA, DROPOUT = 16, 32, 0.05
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MB = 2**20


# -- the child processes: one run each, memory measured from after the imports -----------------

def resident_bytes() -> int:
    with open("/proc/self/statm") as f:  # Linux, as ru_maxrss in kB is
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(kind: str, args: list[str]) -> None:
    """Import what every run imports, note the resident memory, run, print the measurements."""
    import importlib
    import resource

    import torch

    for name in ("deepspeed", "peft"):  # what every run imports (peft imports transformers)
        importlib.import_module(name)

    torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    baseline = resident_bytes()
    result = run_trl(*args) if kind == "trl" else run_llmkit_cli(args)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({**result, "peak_mb": peak / MB, "training_mb": (peak - baseline) / MB}))


def run_llmkit_cli(args: list[str]) -> dict:
    from llmkit.cli.app import main

    sys.argv = ["llmkit", *args]
    try:
        main()
    except SystemExit as e:
        if e.code:
            raise
    return {}


def run_trl(hf_dir: str, steps: str, batch: str, seq_len: str, lora: str, checkpointing: str) -> dict:
    import logging

    import peft
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    class StepTimer(TrainerCallback):
        seconds: list = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.started)

    logging.getLogger("transformers").setLevel(logging.ERROR)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    dataset = Dataset.from_list(conversations(int(steps) * int(batch)))
    peft_config = (peft.LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=DROPOUT, target_modules=TARGETS,
                                   task_type="CAUSAL_LM") if lora == "1" else None)
    with tempfile.TemporaryDirectory() as out:
        config = SFTConfig(output_dir=out, per_device_train_batch_size=int(batch), max_steps=int(steps),
                           learning_rate=2e-4, lr_scheduler_type="cosine", warmup_steps=2,
                           weight_decay=0.0, max_grad_norm=1.0, logging_steps=1, save_strategy="no",
                           report_to="none", use_cpu=True, max_length=int(seq_len), packing=False,
                           seed=0, dataloader_num_workers=0, disable_tqdm=True,
                           gradient_checkpointing=checkpointing == "1")
        timer = StepTimer()
        trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                             peft_config=peft_config, callbacks=[timer])
        trainer.remove_callback(PrinterCallback)
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"step_s": statistics.median(timer.seconds[1:]), "trainable": trainable,
            "first_loss": losses[0], "last_loss": losses[-1]}


def conversations(n: int) -> list[dict]:
    """The first n rows as TRL's conversational prompt/completion rows (loss on the completion)."""
    out = []
    for line in ROWS.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        messages = row.get("messages") or [{"role": "user", "content": row["prompt"]},
                                           {"role": "assistant", "content": row["response"]}]
        out.append({"prompt": messages[:-1], "completion": messages[-1:]})
        if len(out) == n:
            return out
    raise SystemExit(f"{ROWS} has fewer than {n} rows")


# -- the parent: inputs, runs, report -----------------------------------------------------------

def spawn(kind: str, args: list[str], threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "BENCH_THREADS": str(threads)}
    done = subprocess.run([sys.executable, __file__, "--child", kind, *map(str, args)], env=env, cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{kind} {' '.join(map(str, args))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def llmkit(ws: Path, *args: str, threads: int) -> dict:
    return spawn("llmkit", [*args, "-w", str(ws)], threads)


def build_inputs(ws: Path, preset: str, n_rows: int, threads: int) -> Path:
    """The SFT rows as a dataset, a tokenizer trained on them, a random model of `preset` as a
    checkpoint run `base`, and its transformers export."""
    lines = ROWS.read_text(encoding="utf-8").splitlines()
    for name, rows in (("sft_rows", lines[:n_rows]), ("tokenizer_text", lines[:2000])):
        data = ws.parent / f"{name}.jsonl"
        data.write_text("\n".join(rows) + "\n", encoding="utf-8")
        llmkit(ws, "ingest", str(data), "--kind", "sft", "--out", name, threads=threads)
    llmkit(ws, "tokenizer", "--in", "tokenizer_text", "--set", "vocab_size=320", threads=threads)
    write_random_run(ws, "base", preset)
    llmkit(ws, "export", "--from", "base", "--out", "hf", "--set", "probe=false", threads=threads)
    return ws / "hf"


def run_sft(ws: Path, out: str, steps: int, batch: int, seq_len: int, threads: int, lora: bool) -> dict:
    settings = [f"max_steps={steps}", f"micro_batch_size={batch}", "lr=2e-4", "min_lr=0", "warmup_steps=2",
                "betas=[0.9,0.999]", "weight_decay=0", "log_every=1", "eval_every=0", "eval_records=0",
                "eval_fraction=0", f"seq_len={seq_len}", "packing=false"]
    if lora:
        settings += [f"lora.r={R}", f"lora.alpha={ALPHA}", f"lora.dropout={DROPOUT}", "lora.target=all-linear"]
    run = llmkit(ws, "sft", "--from", "base", "--in", "sft_rows", "--out", out,
                 *[a for s in settings for a in ("--set", s)], threads=threads)
    records = [json.loads(line) for line in (ws / out / "metrics.jsonl").open()]
    stats = json.loads((ws / out / "manifest.json").read_text())["stats"]
    return {**run, "step_s": statistics.median(r["step_s"] for r in records[1:]),
            "trainable": stats.get("trainable_parameters"), "first_loss": records[0]["loss"],
            "last_loss": records[-1]["loss"]}


def main() -> None:
    # no abbreviations: a child's llmkit arguments (--set, --in, ...) pass through untouched
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", choices=("llmkit", "trl"), help=argparse.SUPPRESS)
    a, rest = parser.parse_known_args()
    if a.child:
        return child(a.child, rest)

    from llmkit.model import Transformer, model_config

    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        hf_dir = build_inputs(ws, a.preset, a.steps * a.batch, a.threads)
        shape = (a.steps, a.batch, a.seq_len)
        full = run_sft(ws, "full", *shape, a.threads, lora=False)
        ours = run_sft(ws, "lora", *shape, a.threads, lora=True)
        trl = spawn("trl", [hf_dir, *shape, 1, 0], a.threads)
        trl_default = spawn("trl", [hf_dir, *shape, 1, 1], a.threads)
        vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    total = Transformer(model_config(a.preset, vocab_size=vocab)).num_parameters()
    full["trainable"] = total

    print(f"SFT, preset {a.preset} ({total / 1e6:.1f}M parameters, vocab {vocab}), {a.batch} rows/step, "
          f"seq_len {a.seq_len}, {a.steps} steps, fp32, {a.threads} CPU threads; LoRA r={R} alpha={ALPHA} "
          f"on {','.join(TARGETS)}")
    print(f"  {'run':<44} {'trainable':>12} {'share':>7} {'peak RSS':>9} {'training':>9} {'step':>8}  loss")
    for name, r in [("llmkit sft, full fine-tuning", full), ("llmkit sft, LoRA", ours),
                    ("TRL SFTTrainer + peft LoRA (no grad. ckpt)", trl),
                    ("TRL SFTTrainer + peft LoRA (its defaults)", trl_default)]:
        print(f"  {name:<44} {r['trainable']:>12,} {r['trainable'] / total:>6.2%} {r['peak_mb']:>6,.0f} MB "
              f"{r['training_mb']:>6,.0f} MB {r['step_s'] * 1000:>5.0f} ms  "
              f"{r['first_loss']:.3f} -> {r['last_loss']:.3f}")
    frozen = total - ours["trainable"]
    print(f"  LoRA vs full, llmkit: training memory {full['training_mb'] - ours['training_mb']:,.0f} MB lower "
          f"(AdamW moments of the {frozen / 1e6:.1f}M frozen weights: {8 * frozen / MB:,.0f} MB; with their "
          f"gradients {12 * frozen / MB:,.0f} MB); step time {full['step_s'] / ours['step_s']:.2f}x")
    print(f"  llmkit LoRA steps/s / TRL's, same work (no gradient checkpointing): "
          f"{trl['step_s'] / ours['step_s']:.2f}x; vs TRL's defaults: {trl_default['step_s'] / ours['step_s']:.2f}x")


if __name__ == "__main__":
    main()
