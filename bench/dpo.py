"""DPO steps/s: `llmkit dpo` against TRL's `DPOTrainer` on the same model, data and batch size (CPU).

One tiny llmkit model (the `tiny` preset, random weights) is exported with `llmkit export`, so
TRL trains the very same weights as a transformers `LlamaForCausalLM`, with the same tokenizer
and chat template, on the same preference pairs (the demo's `pref_train.jsonl`). Both use
sigmoid DPO (β 0.1), `BATCH` pairs per step, `STEPS` steps (one epoch), the same learning-rate
schedule.

Runs, each as optimizer steps per second of training:
- llmkit with its defaults (fp32; batches of pairs of similar length; reference log-probs
  precomputed in one pass before training: the second figure adds that pass's share of the
  timed steps),
- llmkit with `precompute_ref=false` (reference forward every step, as TRL's default), with its
  length-grouped batches and with random batches (its sorting window cut to one batch),
- TRL `DPOTrainer` with its defaults: random batches, reference forward every step, activation
  checkpointing and, since TRL's configs default `bf16` to True when fp16 is off, bf16 autocast
  on the CPU,
- TRL for the same work as llmkit's `precompute_ref=false` runs: fp32 (`bf16=False`), no
  activation checkpointing, with random batches and with `train_sampling_strategy=
  "group_by_length"` (transformers' LengthGroupedSampler, given each pair's padded length).
A batch pads its 2 x BATCH sequences to the longest, so the grouping sets the positions a step
computes: each run's positions (rows x padded width) and real tokens are printed, per timed step
and in all, and the speed-ups are given for both like-for-like pairs (each side grouping by
length; random batches on both).

How it is timed, the same way on both sides (bench/steps.py): every run is a fresh process
(`OMP_NUM_THREADS` and torch's threads = `--threads`) that stamps the wall-clock time at the end
of each optimizer step (llmkit: when the engine writes the step's metrics record, log_every=1;
TRL: a callback's `on_step_end`). The rate is (STEPS − WARMUP) / (end of the last step − end of
step WARMUP): process start, imports, model loading, tokenisation, trainer set-up and the first
WARMUP steps (allocator and kernel warm-up) are excluded on both sides; everything in between
(batch collation, the step, logging) is counted on both. A second figure divides by the median
step time instead, which a burst of other work shorter than half a run does not move. `--reps`
repetitions run one after the other, the order of the runs alternating between repetitions;
each figure is the median [min–max] over them, each ratio the median [min–max] of the
per-repetition ratios. The 1-minute load average is printed before and after each repetition,
and a warning when it went past the cores: with as many threads as cores, any other job on the
machine slows a run by far more than its share of the CPU (each parallel region waits for a
descheduled thread); `--threads 1` is the robust choice on a shared machine.

    python bench/dpo.py [--steps 30] [--batch 8] [--threads 2] [--reps 3] [--warmup 2] [--same-work-only]
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
import subprocess  # noqa: E402
import tempfile  # noqa: E402

# bench/grpo.py imports these from here
from bench.steps import (child_main, cpu_rate, llmkit_step_ends, load_warning, padding, padding_header,  # noqa: E402
                         padding_line, rates, record_batches, repeat, spawn, spread, step_end_timer)

PAIRS = REPO / "recipes/demo/data/tasks/pref_train.jsonl"


def llmkit(ws: Path, *args: str, threads: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "LLMKIT_WORKSPACE": str(ws)}
    done = subprocess.run([sys.executable, "-m", "llmkit", *args], env=env, cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"llmkit {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


def build_inputs(ws: Path, n_pairs: int, threads: int) -> Path:
    """Preference data, a tokenizer, a random `tiny` model as a checkpoint run, its HF export."""
    rows = [json.loads(line) for line in PAIRS.read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if "chosen" in r][:n_pairs]  # one pair per row: exactly n_pairs
    data = ws.parent / "pairs.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    llmkit(ws, "ingest", str(data), "--kind", "preference", "--out", "pairs", threads=threads)
    llmkit(ws, "tokenizer", "--in", "pairs", "--set", "vocab_size=320", threads=threads)
    write_random_run(ws, "base")
    llmkit(ws, "export", "--from", "base", "--out", "hf", "--set", "probe=false", threads=threads)
    return ws / "hf"


def write_random_run(ws: Path, name: str, preset: str = "tiny") -> None:
    """A checkpoint run `name` of a randomly initialised `preset` model with ws/tokenizer (bench/lora.py too)."""
    import dataclasses

    import torch

    from llmkit.model.transformer import Transformer
    from llmkit.model.config import model_config
    from llmkit.tokenizers.sentencepiece import Tokenizer
    from llmkit.checkpoints import step_folders as ckpt
    from llmkit.core.workspace import Workspace

    tokenizer = Tokenizer(ws / "tokenizer")
    torch.manual_seed(0)
    model = Transformer(model_config(preset, vocab_size=tokenizer.vocab_size))
    b = Workspace(ws).builder(name, stage="pretrain", config={"bench": f"random {preset}"},
                              in_place=True, quiet=True)
    with b:
        step = b.dir / ckpt.step_dir_name(0)
        step.mkdir(parents=True, exist_ok=True)
        named = model.state_dict(keep_vars=True)
        ckpt.save_weights(step / ckpt.WEIGHTS, {k: v.detach() for k, v in named.items()},
                          ckpt.tied_groups(named))
        (step / ckpt.MODEL_CONFIG).write_text(json.dumps(dataclasses.asdict(model.config)))
        tokenizer.save(step / ckpt.TOKENIZER)
        ckpt.mark_complete(step)


# -- the runs ---------------------------------------------------------------------------------------

def run_llmkit(ws: Path, out: str, steps: int, batch: int, threads: int, warmup: int, *extra: str,
               random_batches: bool = False) -> dict:
    settings = [f"max_steps={steps}", f"micro_batch_size={batch}", "lr=1e-4", "min_lr=1e-5",
                "warmup_steps=2", "log_every=1", "eval_every=0", "eval_records=0",
                "eval_fraction=0", "seq_len=128", *extra]
    args = ["dpo", "--from", "base", "--in", "pairs", "--out", out, "--force",
            *[a for s in settings for a in ("--set", s)]]
    run = spawn(__file__, "llmkit", {"args": args, "random_batches": random_batches}, threads, ws)
    records = [json.loads(line) for line in (ws / out / "metrics.jsonl").open()]
    stats = json.loads((ws / out / "manifest.json").read_text())["stats"]
    per_step = stats.get("reference_seconds", 0.0) / steps  # each step's share of the reference pass
    return {**rates(run["ends"], warmup, steps), "cpu_rate": cpu_rate(run["cpu_ends"], warmup, steps),
            "with_ref": rates(run["ends"], warmup, steps, extra_s=per_step),
            "padding": padding(run["batches"], warmup, steps),
            "first_loss": records[0]["loss"], "last_loss": records[-1]["loss"]}


def group_by_length(trainer) -> None:
    """TRL's DPO rows hold prompt_ids, chosen_ids and rejected_ids, no input_ids a Trainer could
    measure: give its LengthGroupedSampler each pair's padded length (prompt + the longer reply,
    as the collator pads chosen and rejected to one width; llmkit's `Pair` length)."""
    trainer.train_dataset = trainer.train_dataset.map(lambda r: {"length": len(r["prompt_ids"]) + max(
        len(r["chosen_ids"]), len(r["rejected_ids"]))})


def trl_child(p: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import DPOConfig, DPOTrainer

    from llmkit.data.io import read_table

    hf_dir = Path(p["hf_dir"])
    rows = read_table(hf_dir.parent / "pairs").to_pylist()  # ranked rows already expanded to pairs
    dataset = Dataset.from_list([
        {"prompt": [{"role": "user", "content": r["prompt"]}],
         "chosen": [{"role": "assistant", "content": r["chosen"]}],
         "rejected": [{"role": "assistant", "content": r["rejected"]}]} for r in rows])
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    timer = step_end_timer()
    grouped = p["group_by_length"]
    with tempfile.TemporaryDirectory() as out:
        args = DPOConfig(output_dir=out, per_device_train_batch_size=p["batch"], max_steps=p["steps"],
                         learning_rate=1e-4, lr_scheduler_type="cosine", warmup_steps=2, beta=0.1,
                         logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                         max_length=128, seed=0, dataloader_num_workers=0, disable_tqdm=True,
                         train_sampling_strategy="group_by_length" if grouped else "random",
                         remove_unused_columns=not grouped,  # keeps the length column
                         **p["options"])
        trainer = DPOTrainer(model=model, args=args, train_dataset=dataset,
                             processing_class=tokenizer, callbacks=[timer])
        trainer.remove_callback(PrinterCallback)
        if grouped:
            group_by_length(trainer)
        batches = record_batches(trainer)
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"ends": timer.ends, "cpu_ends": timer.cpu_ends, "batches": batches, "first_loss": losses[0],
            "last_loss": losses[-1],
            "bf16": bool(args.bf16), "checkpointing": bool(args.gradient_checkpointing)}


def run_trl(hf_dir: Path, steps: int, batch: int, threads: int, warmup: int, group_by_length: bool = False,
            **options) -> dict:
    result = spawn(__file__, "trl", {"hf_dir": str(hf_dir), "steps": steps, "batch": batch,
                                     "group_by_length": group_by_length, "options": options}, threads)
    return {**result, **rates(result.pop("ends"), warmup, steps),
            "cpu_rate": cpu_rate(result.pop("cpu_ends"), warmup, steps),
            "padding": padding(result.pop("batches"), warmup, steps)}


CHILDREN = {"llmkit": llmkit_step_ends, "trl": trl_child}
FP32_NO_CKPT = dict(bf16=False, gradient_checkpointing=False)  # what llmkit does: the same work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3, help="repetitions (median and spread reported)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of every rate")
    parser.add_argument("--same-work-only", action="store_true",
                        help="only the four like-for-like runs (not llmkit's and TRL's defaults)")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("payload", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                        help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    a = parser.parse_args()
    if a.child:
        return child_main(CHILDREN, a.child, a.payload)
    if a.quick:
        a.steps, a.warmup, a.reps, a.threads, a.batch, a.same_work_only = 4, 1, 1, 1, 4, True
    if not 1 <= a.warmup < a.steps or a.reps < 1:
        parser.error("need 1 <= --warmup < --steps and --reps >= 1")

    shape = (a.steps, a.batch, a.threads, a.warmup)
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        hf_dir = build_inputs(ws, a.steps * a.batch, a.threads)  # one epoch
        runs = [("ours", lambda: run_llmkit(ws, "dpo", *shape)),
                ("live", lambda: run_llmkit(ws, "dpo_live", *shape, "precompute_ref=false")),
                ("live_random", lambda: run_llmkit(ws, "dpo_random", *shape, "precompute_ref=false",
                                                   random_batches=True)),
                ("trl", lambda: run_trl(hf_dir, *shape)),
                ("trl_plain", lambda: run_trl(hf_dir, *shape, **FP32_NO_CKPT)),
                ("trl_grouped", lambda: run_trl(hf_dir, *shape, group_by_length=True, **FP32_NO_CKPT))]
        if a.same_work_only:
            runs = [run for run in runs if run[0] not in ("ours", "trl")]
        results, loads = repeat(runs, a.reps)
    report(a, results, loads)


def report(a, results: list[dict], loads: list[tuple[float, float]]) -> None:
    def column(name, key, with_ref=False):
        return [(r[name]["with_ref"] if with_ref else r[name])[key] for r in results]

    def ratios(ours, peer, key, with_ref=False):
        return [a / b for a, b in zip(column(ours, key, with_ref), column(peer, key))]

    trl = results[0].get("trl", {"bf16": True, "checkpointing": True})
    rows = [
        ("llmkit dpo, length-grouped (precomputed ref), loop", "ours", False),
        ("llmkit dpo, length-grouped (precomputed ref), incl. ref pass", "ours", True),
        ("llmkit dpo, length-grouped, precompute_ref=false", "live", False),
        ("llmkit dpo, random batches, precompute_ref=false", "live_random", False),
        (f"TRL DPOTrainer defaults: random batches, {'bf16 autocast, ' if trl['bf16'] else ''}"
         f"{'activation checkpointing' if trl['checkpointing'] else 'no checkpointing'}", "trl", False),
        ("TRL DPOTrainer, random batches, fp32, no checkpointing", "trl_plain", False),
        ("TRL DPOTrainer, group_by_length, fp32, no checkpointing", "trl_grouped", False),
    ]
    print(f"DPO, tiny model, {a.batch} pairs/step, {a.steps} steps (one epoch), {a.threads} CPU threads, "
          f"{a.reps} repetitions; steps/s of steps {a.warmup + 1}-{a.steps} (start-up and the first "
          f"{a.warmup} steps excluded on both sides), each side timed from step end to step end: over "
          f"their wall-clock time, and from their median step")
    for i, (r, (before, after)) in enumerate(zip(results, loads), 1):
        print(f"  rep {i}: load {before:.2f} -> {after:.2f}; steps/s " + ", ".join(
            f"{key} {r[key]['rate']:.2f}" for key in r))
    rows = [row for row in rows if row[1] in results[0]]
    width = max(len(row[0]) for row in rows)
    print(f"  {'median [min-max] over the repetitions':<{width}} {'wall-clock':>22} {'median step':>22} "
          f"{'per CPU-second':>22}")
    for name, key, with_ref in rows:
        cpu = "" if with_ref else spread(column(key, "cpu_rate"))
        print(f"  {name:<{width}} {spread(column(key, 'rate', with_ref)):>22} "
              f"{spread(column(key, 'median_rate', with_ref)):>22} {cpu:>22} steps/s")
    print(padding_header(width))
    for name, key, with_ref in rows:
        if not with_ref:
            print(padding_line(name, results[0][key]["padding"], width))
    ours, theirs = results[0]["live_random"], results[0]["trl_plain"]
    print(f"  loss first -> last (rep 1, random batches): llmkit {ours['first_loss']:.4f} -> "
          f"{ours['last_loss']:.4f}, TRL {theirs['first_loss']:.4f} -> {theirs['last_loss']:.4f}")
    for what, mine, peer, with_ref in (
            ("both with defaults (llmkit's ref pass included; each its own batching)", "ours", "trl", True),
            ("same work, each side grouping by length (fp32, reference forward every step, no "
             "activation checkpointing)", "live", "trl_grouped", False),
            ("same work, random batches on both sides", "live_random", "trl_plain", False)):
        if peer not in results[0]:
            continue
        computed = results[0][peer]["padding"]["padded_timed"] / results[0][mine]["padding"]["padded_timed"]
        print(f"  speed-up vs TRL, {what}: {spread(ratios(mine, peer, 'rate', with_ref))}x "
              f"(median step: {spread(ratios(mine, peer, 'median_rate', with_ref))}x; per CPU-second: "
              f"{spread(ratios(mine, peer, 'cpu_rate'))}x); TRL computes "
              f"{computed:.2f}x llmkit's padded tokens in the timed steps")
    if warning := load_warning(loads, a.threads):
        print(warning)


if __name__ == "__main__":
    main()
