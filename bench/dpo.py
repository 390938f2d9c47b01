"""DPO steps/s: `llmkit dpo` against TRL's `DPOTrainer` on the same model, data and batch size (CPU).

One tiny llmkit model (the `tiny` preset, random weights) is exported with `llmkit export`, so
TRL trains the very same weights as a transformers `LlamaForCausalLM`, with the same tokenizer
and chat template, on the same preference pairs (the demo's `pref_train.jsonl`). Both use
sigmoid DPO (β 0.1), fp32, `BATCH` pairs per step, `STEPS` steps, the same learning-rate schedule.

Reported, each as optimizer steps per second of training:
- llmkit (default: reference log-probs precomputed in one pass before training; that pass is
  counted in the end-to-end figure),
- llmkit with `precompute_ref=false` (reference forward every step, as TRL's default),
- TRL `DPOTrainer` with its defaults (reference forward every step, activation checkpointing),
  and without activation checkpointing, from its `train_runtime`.
Model loading, tokenisation and process start are excluded on both sides.

    python bench/dpo.py [--steps 30] [--batch 8] [--threads 2]   (the data is one epoch: steps x batch pairs)
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
    from llmkit.train import checkpoint as ckpt
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


def run_llmkit(ws: Path, out: str, steps: int, batch: int, threads: int, *extra: str) -> dict:
    settings = [f"max_steps={steps}", f"micro_batch_size={batch}", "lr=1e-4", "min_lr=1e-5",
                "warmup_steps=2", "log_every=1", "eval_every=0", "eval_records=0",
                "eval_fraction=0", "seq_len=128", *extra]
    started = time.perf_counter()
    llmkit(ws, "dpo", "--from", "base", "--in", "pairs", "--out", out,
           *[a for s in settings for a in ("--set", s)], threads=threads)
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (ws / out / "metrics.jsonl").open()]
    stats = json.loads((ws / out / "manifest.json").read_text())["stats"]
    loop = sum(r["step_s"] for r in records)
    return {"loop_s": loop, "reference_s": stats["reference_seconds"], "wall_s": wall,
            "first_loss": records[0]["loss"], "last_loss": records[-1]["loss"]}


def run_trl(hf_dir: Path, steps: int, batch: int, threads: int, **options) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(threads)
    from llmkit.data.io import read_table

    rows = read_table(hf_dir.parent / "pairs").to_pylist()  # ranked rows already expanded to pairs
    dataset = Dataset.from_list([
        {"prompt": [{"role": "user", "content": r["prompt"]}],
         "chosen": [{"role": "assistant", "content": r["chosen"]}],
         "rejected": [{"role": "assistant", "content": r["rejected"]}]} for r in rows])
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    with tempfile.TemporaryDirectory() as out:
        args = DPOConfig(output_dir=out, per_device_train_batch_size=batch, max_steps=steps,
                         learning_rate=1e-4, lr_scheduler_type="cosine", warmup_steps=2, beta=0.1,
                         logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                         max_length=128, seed=0, dataloader_num_workers=0, disable_tqdm=True,
                         **options)
        trainer = DPOTrainer(model=model, args=args, train_dataset=dataset,
                             processing_class=tokenizer)
        trainer.remove_callback(PrinterCallback)
        result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"loop_s": result.metrics["train_runtime"], "first_loss": losses[0],
            "last_loss": losses[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    a = parser.parse_args()
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        hf_dir = build_inputs(ws, a.steps * a.batch, a.threads)  # one epoch
        ours = run_llmkit(ws, "dpo", a.steps, a.batch, a.threads)
        live = run_llmkit(ws, "dpo_live", a.steps, a.batch, a.threads, "precompute_ref=false")
        trl = run_trl(hf_dir, a.steps, a.batch, a.threads)
        trl_plain = run_trl(hf_dir, a.steps, a.batch, a.threads, gradient_checkpointing=False)

    def rate(seconds: float) -> float:
        return a.steps / seconds

    rows = [
        ("llmkit dpo (precomputed ref), loop", rate(ours["loop_s"])),
        ("llmkit dpo (precomputed ref), incl. ref pass", rate(ours["loop_s"] + ours["reference_s"])),
        ("llmkit dpo (precompute_ref=false)", rate(live["loop_s"])),
        ("TRL DPOTrainer (defaults: activation checkpointing)", rate(trl["loop_s"])),
        ("TRL DPOTrainer (gradient_checkpointing=False)", rate(trl_plain["loop_s"])),
    ]
    print(f"DPO, tiny model, {a.batch} pairs/step, {a.steps} steps (one epoch), "
          f"{a.threads} CPU threads")
    for name, r in rows:
        print(f"  {name:<52} {r:7.2f} steps/s")
    print(f"  loss first -> last: llmkit {ours['first_loss']:.4f} -> {ours['last_loss']:.4f}, "
          f"TRL {trl['first_loss']:.4f} -> {trl['last_loss']:.4f}")
    speedup = rate(ours["loop_s"] + ours["reference_s"]) / rate(trl["loop_s"])
    same = rate(live["loop_s"]) / rate(trl_plain["loop_s"])
    print(f"  speed-up vs TRL, both with defaults (llmkit's ref pass included): {speedup:.2f}x")
    print(f"  speed-up vs TRL, same work (reference forward every step, no activation "
          f"checkpointing): {same:.2f}x")


if __name__ == "__main__":
    main()
