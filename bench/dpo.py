"""DPO steps/s: `llmkit dpo` against TRL's `DPOTrainer` on the same model, data and batch size (CPU).

One tiny llmkit model (the `tiny` preset, random weights) is exported with `llmkit export`, so
TRL trains the very same weights as a transformers `LlamaForCausalLM`, with the same tokenizer
and chat template, on the same preference pairs (the demo's `pref_train.jsonl`). Both use
sigmoid DPO (β 0.1), `BATCH` pairs per step, `STEPS` steps, the same learning-rate schedule.

Runs, each as optimizer steps per second of training:
- llmkit with its defaults (fp32; reference log-probs precomputed in one pass before training:
  the second figure adds that pass's share of the timed steps),
- llmkit with `precompute_ref=false` (reference forward every step, as TRL's default),
- TRL `DPOTrainer` with its defaults: reference forward every step, activation checkpointing and,
  since TRL's configs default `bf16` to True when fp16 is off, bf16 autocast on the CPU,
- TRL for the same work as the second run: fp32 (`bf16=False`), no activation checkpointing.

How it is timed, the same way on both sides: every run is a fresh process (`OMP_NUM_THREADS` and
torch's threads = `--threads`) that stamps the wall-clock time at the end of each optimizer step
(llmkit: when the engine writes the step's metrics record, log_every=1; TRL: a callback's
`on_step_end`). The rate is (STEPS − WARMUP) / (end of the last step − end of step WARMUP): process
start, imports, model loading, tokenisation, trainer set-up and the first WARMUP steps (allocator
and kernel warm-up) are excluded on both sides; everything in between (batch collation, the
step, logging) is counted on both. A second figure divides by the median step time instead,
which a burst of other work shorter than half a run does not move. `--reps` repetitions run one
after the other, the order of the runs alternating between repetitions; each figure is the
median [min–max] over them, each ratio the median [min–max] of the per-repetition ratios. The
1-minute load average is printed before and after each repetition, and a warning when it went
past the cores: with as many threads as cores, any other job on the machine slows a run by far
more than its share of the CPU (each parallel region waits for a descheduled thread); `--threads
1` is the robust choice on a shared machine.

    python bench/dpo.py [--steps 30] [--batch 8] [--threads 2] [--reps 3] [--warmup 2]
    (the data is one epoch: steps x batch pairs)
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

    from llmkit.model import Transformer, model_config
    from llmkit.tokenizer import Tokenizer
    from llmkit import checkpoints as ckpt
    from llmkit.workspace import Workspace

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


# -- timing, shared with bench/grpo.py: one fresh process per run, a stamp at each step's end -----

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


def llmkit_step_ends(args: list[str]) -> dict:
    """Run `llmkit ARGS` in this process (a training stage with log_every=1); {"ends": the
    wall-clock time at the end of each optimizer step}: when the engine writes its metrics record."""
    from llmkit.cli.app import main
    from llmkit.train.metrics import MetricsLog

    ends, write = [], MetricsLog.write

    def stamped(self, record):
        ends.append(time.perf_counter())
        write(self, record)

    MetricsLog.write = stamped
    try:
        main(list(args))
    except SystemExit as e:
        if e.code:
            raise
    finally:
        MetricsLog.write = write
    return {"ends": ends}


def step_end_timer():
    """A transformers TrainerCallback; its `ends` are the times of each optimizer step's end."""
    from transformers import TrainerCallback

    class StepEnds(TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    return StepEnds()


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
            "median_rate": cycle / (statistics.median(cycles) + extra_s * cycle)}


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


# -- the runs ---------------------------------------------------------------------------------------

def run_llmkit(ws: Path, out: str, steps: int, batch: int, threads: int, warmup: int, *extra: str) -> dict:
    settings = [f"max_steps={steps}", f"micro_batch_size={batch}", "lr=1e-4", "min_lr=1e-5",
                "warmup_steps=2", "log_every=1", "eval_every=0", "eval_records=0",
                "eval_fraction=0", "seq_len=128", *extra]
    args = ["dpo", "--from", "base", "--in", "pairs", "--out", out, "--force",
            *[a for s in settings for a in ("--set", s)]]
    ends = spawn(__file__, "llmkit", args, threads, ws)["ends"]
    records = [json.loads(line) for line in (ws / out / "metrics.jsonl").open()]
    stats = json.loads((ws / out / "manifest.json").read_text())["stats"]
    per_step = stats.get("reference_seconds", 0.0) / steps  # each step's share of the reference pass
    return {**rates(ends, warmup, steps),
            "with_ref": rates(ends, warmup, steps, extra_s=per_step),
            "first_loss": records[0]["loss"], "last_loss": records[-1]["loss"]}


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
    with tempfile.TemporaryDirectory() as out:
        args = DPOConfig(output_dir=out, per_device_train_batch_size=p["batch"], max_steps=p["steps"],
                         learning_rate=1e-4, lr_scheduler_type="cosine", warmup_steps=2, beta=0.1,
                         logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                         max_length=128, seed=0, dataloader_num_workers=0, disable_tqdm=True,
                         **p["options"])
        trainer = DPOTrainer(model=model, args=args, train_dataset=dataset,
                             processing_class=tokenizer, callbacks=[timer])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"ends": timer.ends, "first_loss": losses[0], "last_loss": losses[-1],
            "bf16": bool(args.bf16), "checkpointing": bool(args.gradient_checkpointing)}


def run_trl(hf_dir: Path, steps: int, batch: int, threads: int, warmup: int, **options) -> dict:
    result = spawn(__file__, "trl", {"hf_dir": str(hf_dir), "steps": steps, "batch": batch,
                                     "options": options}, threads)
    return {**result, **rates(result.pop("ends"), warmup, steps)}


CHILDREN = {"llmkit": llmkit_step_ends, "trl": trl_child}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3, help="repetitions (median and spread reported)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of every rate")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("payload", nargs="?", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        return child_main(CHILDREN, a.child, a.payload)
    if not 1 <= a.warmup < a.steps or a.reps < 1:
        parser.error("need 1 <= --warmup < --steps and --reps >= 1")

    shape = (a.steps, a.batch, a.threads, a.warmup)
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        hf_dir = build_inputs(ws, a.steps * a.batch, a.threads)  # one epoch
        runs = [("ours", lambda: run_llmkit(ws, "dpo", *shape)),
                ("live", lambda: run_llmkit(ws, "dpo_live", *shape, "precompute_ref=false")),
                ("trl", lambda: run_trl(hf_dir, *shape)),
                ("trl_plain", lambda: run_trl(hf_dir, *shape, bf16=False, gradient_checkpointing=False))]
        results, loads = repeat(runs, a.reps)

    def column(name, key, with_ref=False):
        return [(r[name]["with_ref"] if with_ref else r[name])[key] for r in results]

    def ratios(ours, peer, key, with_ref=False):
        return [a / b for a, b in zip(column(ours, key, with_ref), column(peer, key))]

    trl, plain = results[0]["trl"], results[0]["trl_plain"]
    rows = [
        ("llmkit dpo (precomputed ref), loop", "ours", False),
        ("llmkit dpo (precomputed ref), incl. ref pass", "ours", True),
        ("llmkit dpo (precompute_ref=false)", "live", False),
        (f"TRL DPOTrainer (defaults: {'bf16 autocast, ' if trl['bf16'] else ''}"
         f"{'activation checkpointing' if trl['checkpointing'] else 'no checkpointing'})", "trl", False),
        (f"TRL DPOTrainer ({'bf16' if plain['bf16'] else 'fp32'}, gradient_checkpointing="
         f"{plain['checkpointing']})", "trl_plain", False),
    ]
    print(f"DPO, tiny model, {a.batch} pairs/step, {a.steps} steps (one epoch), {a.threads} CPU threads, "
          f"{a.reps} repetitions; steps/s of steps {a.warmup + 1}-{a.steps} (start-up and the first "
          f"{a.warmup} steps excluded on both sides): over their wall-clock time, and from their median step")
    for i, (r, (before, after)) in enumerate(zip(results, loads), 1):
        print(f"  rep {i}: load {before:.2f} -> {after:.2f}; steps/s llmkit {r['ours']['rate']:.2f} "
              f"(incl. ref {r['ours']['with_ref']['rate']:.2f}), live-ref {r['live']['rate']:.2f}, "
              f"TRL defaults {r['trl']['rate']:.2f}, TRL same work {r['trl_plain']['rate']:.2f}")
    width = max(len(row[0]) for row in rows)
    print(f"  {'median [min-max] over the repetitions':<{width}} {'wall-clock':>22} {'median step':>22}")
    for name, key, with_ref in rows:
        print(f"  {name:<{width}} {spread(column(key, 'rate', with_ref)):>22} "
              f"{spread(column(key, 'median_rate', with_ref)):>22} steps/s")
    ours = results[0]["ours"]
    print(f"  loss first -> last (rep 1): llmkit {ours['first_loss']:.4f} -> {ours['last_loss']:.4f}, "
          f"TRL {trl['first_loss']:.4f} -> {trl['last_loss']:.4f}")
    for what, mine, peer, with_ref in (
            ("both with defaults (llmkit's ref pass included)", "ours", "trl", True),
            ("same work (fp32, reference forward every step, no activation checkpointing)", "live",
             "trl_plain", False)):
        print(f"  speed-up vs TRL, {what}: {spread(ratios(mine, peer, 'rate', with_ref))}x "
              f"(median step: {spread(ratios(mine, peer, 'median_rate', with_ref))}x)")
    if warning := load_warning(loads, a.threads):
        print(warning)


if __name__ == "__main__":
    main()
