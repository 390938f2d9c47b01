"""LoRA SFT: llmkit's LoRA against TRL's `SFTTrainer` + peft, and against its own full fine-tuning (CPU).

One random llmkit model of a preset (default `small`; `--preset smol-135m` for SmolLM2-135M's
shapes; the vocabulary is the tokenizer's, trained on the data) is exported with `llmkit
export`, so TRL trains the very same weights as a transformers `LlamaForCausalLM`, with the
same tokenizer and chat template, on the same SFT rows (the demo's `sft_train.jsonl`, one
conversation per sequence: no packing; one epoch: steps x batch rows). Same steps, batch,
sequence length, learning-rate schedule (cosine, warmup 2), AdamW (β 0.9 / 0.999, no decay);
LoRA r=16, α=32, dropout 0.05 on every linear layer of the blocks on both sides; fp32 without
activation checkpointing on both (TRL's configs default to bf16 autocast, even on a CPU, and to
activation checkpointing: `--full` adds a TRL run with those defaults). `--precision bf16` adds
llmkit's LoRA run at `precision=bf16` (run `lora_bf16`; `--runs lora,lora_bf16` for those two alone),
its steps/s over the fp32 run's and both runs' losses step by step.

The same work: each batch pads its rows to its longest, so how rows are grouped into batches
sets the positions a step computes. llmkit groups rows of similar length (LengthBucketSampler,
sorting the whole epoch here), a Trainer draws random batches unless told
`train_sampling_strategy="group_by_length"` (transformers' LengthGroupedSampler: sorted within
mega-batches of up to 50 batches, a quarter of the data at most). Both pairs are run: each side
grouping by length, and random batches on both sides (llmkit's sorting window cut to one batch).
The positions each run computes (rows x padded width) and its real tokens are printed, per timed
step and in all.

Timing (bench/steps.py): both sides from step end to step end — llmkit when the engine writes a
step's metrics record, TRL in `on_step_end` — over the same window, steps WARMUP+1..STEPS, so
fetching and collating a batch count on both; process start, imports, model loading, tokenisation
and the first WARMUP steps do not. `--reps` repetitions alternate the order of the runs; each
figure is the median [min–max] over them; the 1-minute load average is printed before and after
each repetition. OMP_NUM_THREADS and torch's threads are `--threads` in every run (1 by default:
on a shared machine a 2-thread run that meets another job slows 10-20x).

Memory: every run is its own process, which imports torch, deepspeed and peft (so transformers)
before it starts: `peak RSS` is the process's peak resident memory, `training` that peak less the
resident memory after those imports (model, optimizer, activations).

SmolLM2 mode (`--model WS/smollm2 --export HF_DIR`): the imported SmolLM2-135M-Instruct run and its
`llmkit export` folder instead of a random preset, and rows of `--seq-len` tokens (256 there):
each a few-shot prompt (solved examples of the demo's rows, then one more question) whose chat,
answer included, fills 240-256 tokens, so every step computes about batch x seq_len positions.

    python bench/lora.py [--preset small] [--steps 20] [--batch 8] [--threads 1] [--reps 3] [--full]
    python bench/lora.py --preset smol-135m --runs lora,lora_bf16 --precision bf16 --steps 60
    python bench/lora.py --model WS/smollm2 --export HF_DIR --seq-len 256 --steps 6 --warmup 2 [--threads 1]
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

from bench.dpo import llmkit, write_random_run  # noqa: E402
from bench.steps import (child_main, cpu_rate, llmkit_step_ends, load_warning, padding, padding_header,  # noqa: E402
                         padding_line, rates, record_batches, repeat, spawn, spread, step_end_timer)

ROWS = REPO / "recipes/demo/data/tasks/sft_train.jsonl"
R, ALPHA, DROPOUT = 16, 32, 0.05
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MB = 2**20
RATE = "{:.4f}"  # a 135M model makes hundredths of a step per second
# TRL's configs default to bf16 autocast (even on a CPU) and activation checkpointing; llmkit's
# runs here are fp32 without checkpointing, so the same work is TRL with both off
FP32_NO_CKPT = dict(bf16=False, gradient_checkpointing=False)


# -- the child processes: one run each, memory measured from after the imports -----------------

def resident_bytes() -> int:
    with open("/proc/self/statm") as f:  # Linux, as ru_maxrss in kB is
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measured(run):
    """A child: import what every run imports, note the resident memory, run, add the memory."""
    def child(payload: dict) -> dict:
        import importlib
        import resource

        for name in ("deepspeed", "peft"):  # what every run imports (peft imports transformers)
            importlib.import_module(name)
        baseline = resident_bytes()
        result = run(payload)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {**result, "peak_mb": peak / MB, "training_mb": (peak - baseline) / MB}
    return child


def trl_child(p: dict) -> dict:
    import peft
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import SFTConfig, SFTTrainer

    model = AutoModelForCausalLM.from_pretrained(p["hf_dir"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(p["hf_dir"])
    dataset = Dataset.from_list(conversations(p["steps"] * p["batch"], Path(p.get("rows") or ROWS)))
    peft_config = peft.LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=DROPOUT, target_modules=TARGETS,
                                  task_type="CAUSAL_LM")
    timer = step_end_timer()
    with tempfile.TemporaryDirectory() as out:
        # its SFT rows carry input_ids: transformers' LengthGroupedSampler measures them itself
        config = SFTConfig(output_dir=out, per_device_train_batch_size=p["batch"], max_steps=p["steps"],
                           learning_rate=2e-4, lr_scheduler_type="cosine", warmup_steps=2,
                           weight_decay=0.0, max_grad_norm=1.0, logging_steps=1, save_strategy="no",
                           report_to="none", use_cpu=True, max_length=p["seq_len"], packing=False,
                           seed=0, dataloader_num_workers=0, disable_tqdm=True,
                           train_sampling_strategy="group_by_length" if p["group_by_length"] else "random",
                           **({} if p["defaults"] else FP32_NO_CKPT))
        trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                             peft_config=peft_config, callbacks=[timer])
        trainer.remove_callback(PrinterCallback)
        trainable = sum(q.numel() for q in trainer.model.parameters() if q.requires_grad)
        batches = record_batches(trainer)
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"ends": timer.ends, "cpu_ends": timer.cpu_ends, "batches": batches, "trainable": trainable,
            "first_loss": losses[0], "last_loss": losses[-1], "bf16": bool(config.bf16),
            "checkpointing": bool(config.gradient_checkpointing)}


def conversations(n: int, rows: Path = ROWS) -> list[dict]:
    """The first n rows as TRL's conversational prompt/completion rows (loss on the completion)."""
    out = []
    for line in rows.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        messages = row.get("messages") or [{"role": "user", "content": row["prompt"]},
                                           {"role": "assistant", "content": row["response"]}]
        out.append({"prompt": messages[:-1], "completion": messages[-1:]})
        if len(out) == n:
            return out
    raise SystemExit(f"{ROWS} has fewer than {n} rows")


CHILDREN = {"llmkit": measured(llmkit_step_ends), "trl": measured(trl_child)}


# -- the parent: inputs, runs, report -----------------------------------------------------------

def long_rows(a, n_rows: int) -> list[str]:
    """SmolLM2 mode's rows: few-shot prompts whose chat (answer included) is 240-`a.seq_len` tokens."""
    from llmkit.checkpoints.loading import load_tokenizer

    run = Path(a.model)
    tokenizer = load_tokenizer(run / (run / "latest").read_text().strip())
    examples = [json.loads(line) for line in ROWS.read_text(encoding="utf-8").splitlines()]
    examples = [e for e in examples if "prompt" in e]
    out, i = [], 0
    while len(out) < n_rows:
        shots = []
        while True:
            question = examples[i % len(examples)]
            i += 1
            prompt = "".join(f"{e['prompt']}\n{e['response']}\n\n" for e in shots) + question["prompt"]
            chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": question["response"]}]
            length = len(tokenizer.encode_chat(chat)[0])
            if length > a.seq_len:
                break
            if length >= a.seq_len - 16:
                out.append(json.dumps({"prompt": prompt, "response": question["response"]}, ensure_ascii=False))
                break
            shots.append(question)
    return out


def build_inputs(ws: Path, preset: str, n_rows: int, threads: int, a=None) -> Path:
    """The SFT rows as a dataset, a tokenizer trained on them, a random model of `preset` as a
    checkpoint run `base`, and its transformers export (SmolLM2 mode: long rows, the given model)."""
    if a is not None and a.model:
        data = ws.parent / "sft_rows.jsonl"
        data.write_text("\n".join(long_rows(a, n_rows)) + "\n", encoding="utf-8")
        llmkit(ws, "ingest", str(data), "--kind", "sft", "--out", "sft_rows", threads=threads)
        return Path(a.export).resolve()
    lines = ROWS.read_text(encoding="utf-8").splitlines()
    for name, rows in (("sft_rows", lines[:n_rows]), ("tokenizer_text", lines[:2000])):
        data = ws.parent / f"{name}.jsonl"
        data.write_text("\n".join(rows) + "\n", encoding="utf-8")
        llmkit(ws, "ingest", str(data), "--kind", "sft", "--out", name, threads=threads)
    llmkit(ws, "tokenizer", "--in", "tokenizer_text", "--set", "vocab_size=320", threads=threads)
    write_random_run(ws, "base", preset)
    llmkit(ws, "export", "--from", "base", "--out", "hf", "--set", "probe=false", threads=threads)
    return ws / "hf"


def run_sft(ws: Path, a, out: str, lora: bool, random_batches: bool = False, precision: str = "fp32") -> dict:
    settings = [f"max_steps={a.steps}", f"micro_batch_size={a.batch}", "lr=2e-4", "min_lr=0",
                "warmup_steps=2", "betas=[0.9,0.999]", "weight_decay=0", "log_every=1", "eval_every=0",
                "eval_records=0", "eval_fraction=0", f"seq_len={a.seq_len}", "packing=false",
                f"precision={precision}"]
    if lora:
        settings += [f"lora.r={R}", f"lora.alpha={ALPHA}", f"lora.dropout={DROPOUT}", "lora.target=all-linear"]
    args = ["sft", "--from", str(Path(a.model).resolve()) if a.model else "base", "--in", "sft_rows", "--out",
            out, "--force",
            *[x for s in settings for x in ("--set", s)]]
    run = spawn(__file__, "llmkit", {"args": args, "random_batches": random_batches}, a.threads, ws)
    records = [json.loads(line) for line in (ws / out / "metrics.jsonl").open()]
    stats = json.loads((ws / out / "manifest.json").read_text())["stats"]
    return {**run, **timed(run, a), "trainable": stats.get("trainable_parameters"),
            "trainable_share": stats.get("trainable_share"), "precision": stats.get("precision", precision),
            "losses": [r["loss"] for r in records],
            "first_loss": records[0]["loss"], "last_loss": records[-1]["loss"]}


def run_trl(hf_dir: Path, a, group_by_length: bool = False, defaults: bool = False) -> dict:
    run = spawn(__file__, "trl", {"hf_dir": str(hf_dir), "steps": a.steps, "batch": a.batch,
                                  "seq_len": a.seq_len, "group_by_length": group_by_length,
                                  "rows": str(a.rows) if a.model else None,
                                  "defaults": defaults}, a.threads)
    return {**run, **timed(run, a)}


def shown(name: str, r: dict) -> dict:
    """r, printed as soon as its run ends (a long bench on a loaded machine leaves a trace)."""
    print(f"  {name}: {r['rate']:.4f} steps/s (median step {r['median_rate']:.4f}), peak RSS "
          f"{r['peak_mb']:,.0f} MB, {r['padding']['padded_per_step']:,.0f} positions/step; load "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    return r


def timed(run: dict, a) -> dict:
    return {**rates(run.pop("ends"), a.warmup, a.steps), "cpu_rate": cpu_rate(run.pop("cpu_ends"), a.warmup, a.steps),
            "padding": padding(run.pop("batches"), a.warmup, a.steps)}


# (key, label, is llmkit's) of every run; the comparisons: (what, llmkit's run, TRL's run)
RUNS = [("lora", "llmkit sft LoRA, length-grouped batches", True),
        ("lora_random", "llmkit sft LoRA, random batches", True),
        ("trl_grouped", "TRL SFTTrainer + peft, group_by_length, fp32", False),
        ("trl", "TRL SFTTrainer + peft, random batches, fp32", False)]
EXTRAS = [("full", "llmkit sft full fine-tuning, length-grouped", True),
          ("trl_default", "TRL SFTTrainer + peft, defaults (random, bf16 autocast, grad. ckpt)", False)]
LOW_PRECISION = [("lora_bf16", "llmkit sft LoRA, length-grouped batches, precision=bf16", True)]
COMPARISONS = [("each side grouping by length", "lora", "trl_grouped"),
               ("random batches on both sides", "lora_random", "trl"),
               ("each side's defaults (TRL: random batches, bf16 autocast, gradient checkpointing)", "lora",
                "trl_default"),
               # SmolLM2 mode's rows are of one length: the order of the rows changes little
               ("llmkit grouping by length, TRL random batches (fp32)", "lora", "trl")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3, help="repetitions (median and spread reported)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of every rate")
    parser.add_argument("--full", action="store_true",
                        help="also llmkit's full fine-tuning (memory) and TRL with its defaults")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: also llmkit's LoRA run at precision=bf16 (lora_bf16)")
    parser.add_argument("--runs", help="only these runs, e.g. lora,trl (rows of one length: grouping changes nothing)")
    parser.add_argument("--model", help="an llmkit checkpoint run (SmolLM2 mode, e.g. WS/smollm2)")
    parser.add_argument("--export", help="--model's `llmkit export` folder")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("payload", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                        help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    a = parser.parse_args()
    if a.child:
        return child_main(CHILDREN, a.child, a.payload)
    if a.quick:
        a.preset, a.steps, a.warmup, a.reps = (a.preset if a.model else "tiny"), 4, 1, 1
    if not 1 <= a.warmup < a.steps or a.reps < 1:
        parser.error("need 1 <= --warmup < --steps and --reps >= 1")

    from llmkit.model.transformer import Transformer
    from llmkit.model.config import model_config

    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        a.rows = ws.parent / "sft_rows.jsonl"
        hf_dir = build_inputs(ws, a.preset, a.steps * a.batch, a.threads, a)  # one epoch
        runs = {"lora": lambda: run_sft(ws, a, "lora", lora=True),
                "lora_random": lambda: run_sft(ws, a, "lora_random", lora=True, random_batches=True),
                "trl_grouped": lambda: run_trl(hf_dir, a, group_by_length=True),
                "trl": lambda: run_trl(hf_dir, a),
                "full": lambda: run_sft(ws, a, "full", lora=False),
                "lora_bf16": lambda: run_sft(ws, a, "lora_bf16", lora=True, precision="bf16"),
                "trl_default": lambda: run_trl(hf_dir, a, defaults=True)}
        offered = RUNS + (EXTRAS if a.full else []) + (LOW_PRECISION if a.precision == "bf16" else [])
        chosen = [r for r in offered if not a.runs or r[0] in a.runs.split(",")]
        results, loads = repeat([(key, lambda key=key: shown(key, runs[key]())) for key, _, _ in chosen],
                                a.reps)
        vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    total = (Transformer(model_config(a.preset, vocab_size=vocab)).num_parameters() if not a.model else
             round(results[0]["lora"]["trainable"] / results[0]["lora"]["trainable_share"]))
    report(a, chosen, results, loads, total, vocab)


def report(a, chosen, results, loads, total: int, vocab: int) -> None:
    def column(key, field):
        return [r[key][field] for r in results]

    model = Path(a.model).name if a.model else f"preset {a.preset}"
    print(f"SFT, {model} ({total / 1e6:.1f}M parameters, vocab {vocab}), {a.batch} rows/step, "
          f"seq_len {a.seq_len}, {a.steps} steps (one epoch), fp32 unless named, {a.threads} CPU threads, {a.reps} "
          f"repetitions; LoRA r={R} alpha={ALPHA} on {','.join(TARGETS)}; steps/s of steps "
          f"{a.warmup + 1}-{a.steps}, each side timed from step end to step end")
    for i, (r, (before, after)) in enumerate(zip(results, loads), 1):
        print(f"  rep {i}: load {before:.2f} -> {after:.2f}; steps/s " +
              ", ".join(f"{key} {r[key]['rate']:.4f}" for key in r))
    width = max(len(label) for _, label, _ in chosen)
    print(f"  {'median [min-max] over the repetitions':<{width}} {'trainable':>11} {'peak RSS':>9} "
          f"{'training':>9} {'wall-clock':>24} {'median step':>24} {'per CPU-second':>24}  loss (rep 1)")
    for key, label, ours in chosen:
        first = results[0][key]
        trainable = total if key == "full" else first["trainable"]
        print(f"  {label:<{width}} {trainable / total:>10.2%} {statistics.median(column(key, 'peak_mb')):>6,.0f} MB "
              f"{statistics.median(column(key, 'training_mb')):>6,.0f} MB {spread(column(key, 'rate'), RATE):>24} "
              f"{spread(column(key, 'median_rate'), RATE):>24} {spread(column(key, 'cpu_rate'), RATE):>24}  "
              f"{first['first_loss']:.3f} -> {first['last_loss']:.3f}")
    print(padding_header(width))
    for key, label, _ in chosen:
        print(padding_line(label, results[0][key]["padding"], width))
    for what, mine, peer in COMPARISONS:
        if peer not in results[0] or mine not in results[0]:
            continue
        ratios = [r[mine]["rate"] / r[peer]["rate"] for r in results]
        median_ratios = [r[mine]["median_rate"] / r[peer]["median_rate"] for r in results]
        cpu_ratios = [r[mine]["cpu_rate"] / r[peer]["cpu_rate"] for r in results]
        computed = results[0][peer]["padding"]["padded_timed"] / results[0][mine]["padding"]["padded_timed"]
        print(f"  llmkit LoRA steps/s / TRL's, {what}: {spread(ratios)}x (median step: {spread(median_ratios)}x; "
              f"per CPU-second: {spread(cpu_ratios)}x); "
              f"TRL computes {computed:.2f}x llmkit's padded tokens in the timed steps")
    if "lora_bf16" in results[0] and "lora" in results[0]:
        print(precision_comparison(results))
    if "full" in results[0]:
        full, ours = results[0]["full"], results[0]["lora"]
        frozen = total - ours["trainable"]
        print(f"  LoRA vs full, llmkit (rep 1): training memory {full['training_mb'] - ours['training_mb']:,.0f} MB "
              f"lower (AdamW moments of the {frozen / 1e6:.1f}M frozen weights: {8 * frozen / MB:,.0f} MB; with "
              f"their gradients {12 * frozen / MB:,.0f} MB); steps/s {ours['rate'] / full['rate']:.2f}x")
    if warning := load_warning(loads, a.threads):
        print(warning)


def precision_comparison(results: list[dict]) -> str:
    """bf16's steps/s over fp32's (each repetition's pair) and the two loss curves of rep 1."""
    ratios = [r["lora_bf16"]["rate"] / r["lora"]["rate"] for r in results]
    fp32, bf16 = results[0]["lora"]["losses"], results[0]["lora_bf16"]["losses"]
    worst = max(abs(b - f) / f for f, b in zip(fp32, bf16))
    tail = min(10, len(fp32))
    mean_f, mean_b = statistics.fmean(fp32[-tail:]), statistics.fmean(bf16[-tail:])
    return (f"  llmkit LoRA precision=bf16 (trained in {results[0]['lora_bf16']['precision']}) steps/s / fp32's: "
            f"{spread(ratios)}x; loss after {len(fp32)} steps (rep 1): fp32 {fp32[-1]:.4f}, bf16 {bf16[-1]:.4f} "
            f"({(bf16[-1] - fp32[-1]) / fp32[-1]:+.2%}); mean of the last {tail} steps {mean_f:.4f} vs "
            f"{mean_b:.4f} ({(mean_b - mean_f) / mean_f:+.2%}); largest step-wise gap {worst:.2%}")


if __name__ == "__main__":
    main()
