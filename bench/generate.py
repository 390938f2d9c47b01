"""Generation tokens/s: llmkit's KV-cache `generate` (what `llmkit generate`, rollouts and eval's
generation call) against transformers' `generate` on the folder `llmkit export` wrote from the
same run (CPU, fp32).

Both sides get the same left-padded batches of `--batch` chat prompts (SmolLM2's chat template,
`recipes/smollm2/general_prompts.jsonl`), the same stop token (the end of turn) and `--new-tokens`
at most, sampling from the whole distribution at temperature 1 (`--greedy`: the likeliest token).
transformers runs with its default dynamic cache and with `cache_implementation="static"` (the
preallocated cache llmkit uses); tokenising and detokenising are left out on both sides.

Each run is a fresh process (one side, one cache kind) that loads its model, generates the first
batch greedily as a warm-up, then times `--batches` batches from the end of that warm-up. llmkit's
side packs its linear layers once for every batch, before the warm-up, as `llmkit generate` does
(`llmkit/generation.py`; 0.24 s at 1 thread on SmolLM2). Sampled sequences differ between the
sides (each its own random stream), and so do their lengths: the default six timed batches (96
rows) keep that draw from deciding the ratio. It reports
the new tokens (each row up to and including its stop token), the positions its forward passes
computed (rows still in the batch × steps: transformers keeps finished rows in the batch, llmkit
drops them; prompt positions counted once per distinct prompt) and the seconds. The two sides'
greedy tokens of the warm-up batch must be identical (printed). `--reps` repetitions alternate
the order of the runs; each figure is the
median [min–max]; the 1-minute load average is printed before and after each repetition.

    python bench/generate.py --model WS/smollm2 --export HF_DIR [--batch 16] [--new-tokens 64]
                             [--batches 6] [--threads 1] [--reps 3] [--greedy]
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
import time  # noqa: E402

from bench.steps import child_main, load_warning, repeat, spawn, spread  # noqa: E402

PROMPTS = REPO / "recipes/smollm2/general_prompts.jsonl"


def prompt_batches(tokenizer, n_batches: int, batch: int) -> list[tuple[list, list]]:
    """(ids, mask) of each left-padded batch of chat prompts, as lists (the payload of both sides)."""
    from llmkit.model.decoding import left_pad
    from llmkit.generation import encode_prompt

    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text(encoding="utf-8").splitlines()]
    if len(prompts) < n_batches * batch:
        raise SystemExit(f"{PROMPTS} has {len(prompts)} prompts, fewer than {n_batches} x {batch}")
    out = []
    for b in range(n_batches):
        ids, mask = left_pad([encode_prompt(tokenizer, p, True) for p in prompts[b * batch:(b + 1) * batch]],
                             tokenizer.pad_id)
        out.append((ids.tolist(), mask.tolist()))
    return out


def counted(out, width: int, stop_id: int, finished_rows_leave: bool) -> dict:
    """New tokens (up to and including each row's stop token) and positions computed in the steps."""
    new = out[:, width:]
    lengths = [(row.index(stop_id) + 1) if stop_id in row else len(row) for row in new.tolist()]
    steps = new.shape[1]
    return {"tokens": sum(lengths), "decode_positions": sum(lengths) if finished_rows_leave else len(lengths) * steps}


def child(p: dict) -> dict:
    import torch

    batches = [(torch.tensor(ids), torch.tensor(mask)) for ids, mask in p["batches"]]
    if p["side"] == "llmkit":
        from llmkit.model.decoding import generate
        from llmkit.checkpoints.loading import load
        from llmkit.model.packed_linear import packed_linears

        model, _ = load(p["model"], device="cpu")
        model.eval()
        packing = packed_linears(model)  # once for every batch, as `llmkit generate` packs
        packing.__enter__()

        def run(ids, mask, greedy, seed):
            return generate(model, ids, p["new_tokens"], temperature=1.0, greedy=greedy, eos_id=p["stop_id"],
                            attention_mask=mask, generator=torch.Generator().manual_seed(seed))
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(p["export"], dtype=torch.float32).eval()
        cache = {} if p["cache"] == "dynamic" else {"cache_implementation": "static"}

        @torch.no_grad()
        def run(ids, mask, greedy, seed):
            torch.manual_seed(seed)
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=p["new_tokens"],
                                  do_sample=not greedy, temperature=1.0, top_k=0, top_p=1.0,
                                  eos_token_id=p["stop_id"], pad_token_id=p["pad_id"], **cache)
    # the warm-up, the same batch on both sides, greedy: its tokens are compared; timing starts at its end
    greedy_out = run(*batches[0], True, 0)[:, batches[0][0].shape[1]:].tolist()
    tokens = positions = 0
    started = time.perf_counter()
    for i, (ids, mask) in enumerate(batches[1:], 1):
        c = counted(run(ids, mask, p["greedy"], i), ids.shape[1], p["stop_id"], p["side"] == "llmkit")
        tokens, positions = tokens + c["tokens"], positions + c["decode_positions"]
    seconds = time.perf_counter() - started
    prompt_positions = sum(len({tuple(r) for r in ids.tolist()}) * ids.shape[1] for ids, _ in batches[1:])
    return {"seconds": seconds, "tokens": tokens, "decode_positions": positions,
            "prompt_positions": prompt_positions if p["side"] == "llmkit"
            else sum(ids.numel() for ids, _ in batches[1:]),
            "greedy": greedy_out}


CHILDREN = {"run": child}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--model", help="an llmkit checkpoint run (e.g. WS/smollm2)")
    parser.add_argument("--export", help="its `llmkit export` folder")
    parser.add_argument("--batch", type=int, default=16, help="prompts per batch")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, default=6, help="batches timed after the warm-up batch")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--greedy", action="store_true", help="time greedy decoding instead of sampling")
    parser.add_argument("--hf-caches", default="dynamic,static", help="transformers cache kinds to run")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("payload", nargs="?", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        return child_main(CHILDREN, a.child, a.payload)
    if not (a.model and a.export):
        return print("skip: needs --model and --export, a run and its `llmkit export` folder (e.g. make smollm2)")

    from llmkit.checkpoints.loading import load_tokenizer

    tokenizer = load_tokenizer(latest_step(Path(a.model)))
    payload = {"model": str(Path(a.model).resolve()), "export": str(Path(a.export).resolve()),
               "batches": prompt_batches(tokenizer, a.batches + 1, a.batch), "new_tokens": a.new_tokens,
               "stop_id": tokenizer.end_of_turn_id, "pad_id": tokenizer.pad_id, "greedy": a.greedy}
    runs = [("llmkit", lambda: shown("llmkit", spawn(__file__, "run", {**payload, "side": "llmkit"}, a.threads)))]
    for cache in a.hf_caches.split(","):
        runs.append((f"hf_{cache}", lambda cache=cache: shown(f"hf_{cache}", spawn(
            __file__, "run", {**payload, "side": "hf", "cache": cache}, a.threads))))
    results, loads = repeat(runs, a.reps)
    report(a, results, loads)


def shown(name: str, r: dict) -> dict:
    """r, printed as soon as its run ends (a long bench on a loaded machine leaves a trace)."""
    print(f"  {name}: {r['tokens']} tokens in {r['seconds']:.1f} s ({r['tokens'] / r['seconds']:.2f}/s); "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    return r


def latest_step(run: Path) -> Path:
    return run / (run / "latest").read_text().strip() if (run / "latest").is_file() else run


def report(a, results: list[dict], loads) -> None:
    mode = "greedy" if a.greedy else "sampling at temperature 1"
    print(f"generation, {a.batch} prompts x <= {a.new_tokens} new tokens per batch, {mode}, {a.batches} "
          f"batches timed after 1 warm-up batch, fp32, {a.threads} CPU threads, {a.reps} repetitions")
    for i, (r, (before, after)) in enumerate(zip(results, loads), 1):
        print(f"  rep {i}: load {before:.2f} -> {after:.2f}; " + "; ".join(
            f"{k} {v['tokens']} tokens in {v['seconds']:.1f} s ({v['tokens'] / v['seconds']:.2f}/s), "
            f"positions computed: prompt {v['prompt_positions']}, decode {v['decode_positions']}"
            for k, v in r.items()))
    for key in results[0]:
        print(f"  {key:<12} tokens/s {spread([r[key]['tokens'] / r[key]['seconds'] for r in results])}")
    for key in results[0]:
        if key == "llmkit":
            continue
        ratios = [(r["llmkit"]["tokens"] / r["llmkit"]["seconds"]) / (r[key]["tokens"] / r[key]["seconds"])
                  for r in results]
        same = all(r["llmkit"]["greedy"] == r[key]["greedy"] for r in results)
        print(f"  llmkit / transformers ({key}): {spread(ratios)}x tokens/s; greedy tokens of the first "
              f"batch identical: {same}")
    if warning := load_warning(loads, a.threads):
        print(warning)


if __name__ == "__main__":
    main()
