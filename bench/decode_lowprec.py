"""Decoding through low-precision weights (`decode.weights=fp32|bf16|int8`, issue 55) against
llama.cpp (its Python binding) and transformers, on an llmkit run (SmolLM2-135M).

    python bench/decode_lowprec.py speed   --model RUN --gguf-f16 F --gguf-q8 Q [--threads 1,2] [--reps 3] [--verified]
    python bench/decode_lowprec.py quality --model RUN [--prompts 20] [--new-tokens 128]
    python bench/decode_lowprec.py batch   --model RUN --export HF_DIR [--weights int8] [--batches 2]
    python bench/decode_lowprec.py command --model RUN --export HF_DIR [--weights int8] [--batches 2]

--verified (speed; always in quality's text set) adds bf16_verified and int8_verified: greedy tokens drafted
  through those weights and checked by a float32 pass (`llmkit generate --set verify=true`).
--rounded (speed, quality) adds bf16_rounded and int8_rounded: the same weights multiplying rows rounded as
  they are (bf16; q8_0, as llama.cpp), the kernels before the rows stayed (near) float32.
speed: batch 1, one 64-token prompt (the held-out text of bench/gguf_quality.py, the same ids on every
  side), 128 greedy new tokens without a stop: llmkit fp32 / bf16 / f16 / int8 against llama.cpp's f16 and q8_0
  files of the same run. Each run is a fresh process that loads its model (llmkit converts its weights
  then, once), generates 8 tokens as a warm-up and times one generation: tokens/s over the whole call
  (prefill included) and the decode rate (the 127 steps after the first token, llmkit's prefill and
  first token timed on their own beforehand), and the tokens per CPU second of the process over that
  generation (at 1 thread the figure a loaded machine changes least). Repetitions alternate the order.
quality: greedy tokens of `--prompts` chat prompts (recipes/smollm2/general_prompts.jsonl, batched)
  through bf16, f16 and int8 against fp32, a reply equal when its tokens up to its first stop token are (and
  strictly: all new tokens); where one differs, fp32's margin between its two likeliest tokens at the
  first difference (a near tie: under 0.5 logits); held-out perplexity of 16 windows x 256 tokens.
  `--prompt-set text`: the prompts are the held-out text's 64-token windows after the speed bench's,
  each generated alone (batch 1) for every new token, no stop; with --gguf-f16/--gguf-q8 llama.cpp's
  greedy tokens of the same prompts are compared with llmkit fp32's as well.
batch: bench/generate.py's batches (16 chat prompts x <= 64 sampled tokens) through llmkit with
  `--weights` against transformers' `generate` (dynamic cache), fp32.
command: the same prompts (`--batches` x 16) as whole commands, each timed from spawn to exit
  (interpreter start, imports, loading, converting, tokenising, writing included): `llmkit generate
  --prompts FILE --set batch_size=16 max_new_tokens=64 decode.weights=W` (temperature 1) against the
  script a transformers user writes (AutoTokenizer, AutoModelForCausalLM in fp32, the chat template,
  `generate` sampling at temperature 1 over the whole vocabulary, 16 prompts a batch, decode); each side's
  new tokens up to its stop token are counted and printed beside its seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"] + [str(REPO)]

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

from bench.steps import child_main, load_warning, repeat, spawn, spread  # noqa: E402

PROMPT_TOKENS, NEW_TOKENS, WARMUP_TOKENS = 64, 128, 8
KINDS = ("fp32", "bf16", "f16", "int8")
ROUNDED = ("bf16_rounded", "int8_rounded")  # the rows rounded as the weights (LLMKIT_LOWPREC_ROWS=rounded)
VERIFIED = ("bf16_verified", "int8_verified")  # greedy tokens checked by float32 (llmkit generate verify=true)
HELD: list = []  # the open packing contexts of this process
VERIFIERS: dict = {}  # id(model) -> its float32 twin (the _verified sides) or None


def llmkit_model(path: str, side: str):
    """The run's model with its products through `side`'s weights (fp32 | bf16 | int8, `_rounded`: the
    rows rounded too; `_verified`: its greedy tokens checked by a float32 twin, `verified_decoding`),
    converted and packed once (held open)."""
    from llmkit.checkpoints.loading import load
    from llmkit.model.verified_decoding import packed_for_decoding

    weights, _, rows = side.partition("_")
    verified = rows == "verified"
    if rows and not verified:
        os.environ["LLMKIT_LOWPREC_ROWS"] = rows  # read as the weights are converted
    else:
        os.environ.pop("LLMKIT_LOWPREC_ROWS", None)
    model, tokenizer = load(path, device="cpu")
    model.eval()
    context = packed_for_decoding(model, weights, verified)
    VERIFIERS[id(model)] = context.__enter__()
    HELD.append(context)  # a context manager dropped is closed: its packing undone
    return model, tokenizer


def greedy(model, ids, n: int):
    """The prompt ids [1, T] and n greedy tokens of an `llmkit_model`."""
    from llmkit.model.decoding import generate
    from llmkit.model.verified_decoding import verified_greedy

    verifier = VERIFIERS.get(id(model))
    return generate(model, ids, n, greedy=True) if verifier is None else verified_greedy(model, verifier, ids, n)


def speed_child(p: dict) -> dict:
    import torch

    prompt, n = p["prompt"], p["new_tokens"]
    if p["side"] in KINDS + ROUNDED + VERIFIED:
        started = time.perf_counter()
        model, _ = llmkit_model(p["model"], p["side"])
        ready = time.perf_counter() - started
        ids = torch.tensor([prompt])
        greedy(model, ids, WARMUP_TOKENS)
        t0 = time.perf_counter()
        greedy(model, ids, 1)
        first = time.perf_counter() - t0
        t0, cpu0 = time.perf_counter(), time.process_time()
        out = greedy(model, ids, n)[0, len(prompt):].tolist()
        total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    else:
        import llama_cpp

        from llmkit.eval.efficiency import greedy_llama_cpp

        started = time.perf_counter()
        threads = torch.get_num_threads()
        llm = llama_cpp.Llama(model_path=p["gguf"], n_ctx=256, n_batch=PROMPT_TOKENS, n_threads=threads,
                              n_threads_batch=threads, verbose=False)
        ready = time.perf_counter() - started
        greedy_llama_cpp(llm, prompt, WARMUP_TOKENS)
        t0 = time.perf_counter()
        llm.reset()
        llm.eval(prompt)
        first = time.perf_counter() - t0
        t0, cpu0 = time.perf_counter(), time.process_time()
        out = greedy_llama_cpp(llm, prompt, n)
        total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"tokens_per_s": n / total, "decode_per_s": (n - 1) / max(total - first, 1e-9), "seconds": total, "per_cpu_s": n / cpu,
            "prefill_s": first, "ready_s": ready, "tokens": out}


def quality_child(p: dict) -> dict:
    import torch

    from bench.gguf_quality import PROMPTS
    from llmkit.generation import encode_prompt
    from llmkit.model.decoding import generate, left_pad

    out: dict = {}
    kinds = KINDS + (ROUNDED if p.get("rounded") else ()) + (VERIFIED if p["prompt_set"] == "text" else ())
    for kind in kinds:
        model, tokenizer = llmkit_model(p["model"], kind)
        started = time.perf_counter()
        if p["prompt_set"] == "text":  # batch 1, each prompt alone, as the speed bench
            encoded = english_windows(tokenizer, p["prompts"], PROMPT_TOKENS, skip=1)
            new = [greedy(model, torch.tensor([e]), p["new_tokens"])[0, len(e):].tolist() for e in encoded]
        else:
            prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text(encoding="utf-8").splitlines()]
            encoded = [encode_prompt(tokenizer, q, True) for q in prompts[:p["prompts"]]]
            ids, mask = left_pad(encoded, tokenizer.pad_id)
            new = generate(model, ids, p["new_tokens"], greedy=True, attention_mask=mask)[:, ids.shape[1]:].tolist()
        seconds = time.perf_counter() - started
        nll = count = 0.0
        with torch.no_grad():
            for window in english_windows(tokenizer, p["windows"], p["window"]):
                logits = model(torch.tensor([window]))[0].float()
                nll += torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(window[1:]), reduction="sum").item()
                count += len(window) - 1
        out[kind] = {"replies": new, "ppl": math.exp(nll / count), "generate_s": seconds}
        if kind == "fp32":  # text prompts run to the end: no stop token
            fp32_model, stops = model, set(tokenizer.stop_ids) if p["prompt_set"] == "chat" else set()
    for name, gguf in p.get("ggufs", {}).items():  # llama.cpp's files of the same run, the same prompts
        out[name] = {"replies": llama_cpp_greedy(gguf, encoded, p["new_tokens"])}
        kinds += (name,)
    reference = out["fp32"]["replies"]
    for kind in kinds[1:]:
        equal = strict = 0
        differences = []
        for i, (a, b) in enumerate(zip(out[kind]["replies"], reference)):
            strict += a == b
            if until_stop(a, stops) == until_stop(b, stops):
                equal += 1
                continue
            at = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
            with torch.no_grad():
                logits = fp32_model(torch.tensor([encoded[i] + b[:at]]))[0, -1].float()
            top = logits.topk(2).values
            differences.append({"prompt": i, "at": at, "fp32_margin": round(float(top[0] - top[1]), 4),
                                "fp32_margin_to_chosen": round(float(logits.max() - logits[a[at]]), 4)})
        out[kind]["equal"], out[kind]["strict"], out[kind]["differences"] = equal, strict, differences
    return {k: {key: v for key, v in r.items() if key != "replies"} for k, r in out.items()}


def llama_cpp_greedy(gguf: str, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """`new_tokens` greedy ids after each prompt, alone, through llama.cpp's binding (no stop)."""
    import llama_cpp
    import torch

    from llmkit.eval.efficiency import greedy_llama_cpp

    threads = torch.get_num_threads()
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=PROMPT_TOKENS + new_tokens, n_batch=PROMPT_TOKENS,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    return [greedy_llama_cpp(llm, prompt, new_tokens) for prompt in prompts]


def english_windows(tokenizer, n: int, width: int, skip: int = 0) -> list[list[int]]:
    """bench/gguf_quality.py's held-out English windows after the first `skip` (a list, or its
    {language: windows})."""
    from bench.gguf_quality import held_out_windows

    windows = held_out_windows(tokenizer, n + skip, width)
    return (windows["en"] if isinstance(windows, dict) else windows)[skip:]


def until_stop(tokens: list[int], stops: set) -> list[int]:
    end = next((i for i, t in enumerate(tokens) if t in stops), len(tokens))
    return tokens[:end + 1]


def batch_child(p: dict) -> dict:
    """bench/generate.py's llmkit side with the weights converted first."""
    import torch

    from bench.generate import counted
    from llmkit.model.decoding import generate

    model, _ = llmkit_model(p["model"], p["weights"])
    batches = [(torch.tensor(ids), torch.tensor(mask)) for ids, mask in p["batches"]]

    def run(ids, mask, greedy, seed):
        return generate(model, ids, p["new_tokens"], temperature=1.0, greedy=greedy, eos_id=p["stop_id"],
                        attention_mask=mask, generator=torch.Generator().manual_seed(seed))

    greedy_out = run(*batches[0], True, 0)[:, batches[0][0].shape[1]:].tolist()
    tokens = 0
    started = time.perf_counter()
    for i, (ids, mask) in enumerate(batches[1:], 1):
        tokens += counted(run(ids, mask, p["greedy"], i), ids.shape[1], p["stop_id"], True)["tokens"]
    return {"seconds": time.perf_counter() - started, "tokens": tokens, "greedy": greedy_out}


def hf_command_child(p: dict) -> dict:
    """What a transformers user runs: the folder's tokenizer and model, the chat template, sampled
    `generate` 16 prompts at a time, decode; the new tokens counted up to each row's stop token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(p["export"], padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(p["export"], dtype=torch.float32).eval()
    prompts = [json.loads(line)["prompt"] for line in Path(p["prompts"]).read_text(encoding="utf-8").splitlines()]
    completions, tokens = [], 0
    for start in range(0, len(prompts), 16):
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                               add_generation_prompt=True) for t in prompts[start:start + 16]]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        torch.manual_seed(start)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=p["new_tokens"], do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, eos_token_id=p["stop_id"], pad_token_id=tokenizer.pad_token_id)
        new = [until_stop(row, {p["stop_id"]}) for row in out[:, batch["input_ids"].shape[1]:].tolist()]
        tokens += sum(map(len, new))
        completions += tokenizer.batch_decode(new, skip_special_tokens=True)
    return {"tokens": tokens, "completions": len(completions)}


CHILDREN = {"speed": speed_child, "quality": quality_child, "batch": batch_child, "hf_command": hf_command_child}


def speed(a) -> None:
    from llmkit.checkpoints.loading import load_tokenizer
    from bench.generate import latest_step

    tokenizer = load_tokenizer(latest_step(Path(a.model)))
    prompt = english_windows(tokenizer, 1, PROMPT_TOKENS)[0]
    base = {"model": str(Path(a.model).resolve()), "prompt": prompt, "new_tokens": NEW_TOKENS}
    sides = {k: {**base, "side": k} for k in KINDS + (ROUNDED if a.rounded else ()) + (VERIFIED if a.verified else ())}
    sides["llama_f16"] = {**base, "side": "llama", "gguf": str(Path(a.gguf_f16).resolve())}
    sides["llama_q8_0"] = {**base, "side": "llama", "gguf": str(Path(a.gguf_q8).resolve())}
    for threads in map(int, a.threads.split(",")):
        runs = [(name, lambda name=name, threads=threads: shown(name, spawn(__file__, "speed", sides[name], threads)))
                for name in sides]
        results, loads = repeat(runs, a.reps)
        print(f"batch 1, {PROMPT_TOKENS}-token prompt, {NEW_TOKENS} greedy new tokens, {threads} thread(s), "
              f"{a.reps} runs; loads {', '.join(f'{b:.2f}->{e:.2f}' for b, e in loads)}")
        for name in sides:
            rs = [r[name] for r in results]
            print(f"  {name:<11} tokens/s {spread([r['tokens_per_s'] for r in rs])}  decode/s "
                  f"{spread([r['decode_per_s'] for r in rs])}  prefill s {spread([r['prefill_s'] for r in rs], '{:.3f}')}"
                  f"  tokens per CPU s {spread([r['per_cpu_s'] for r in rs])}"
                  f"  load+convert s {spread([r['ready_s'] for r in rs])}")
        pairs = [("bf16", "llama_f16"), ("f16", "llama_f16"), ("int8", "llama_q8_0"), ("fp32", "llama_f16")]
        if a.verified:
            pairs += [("bf16_verified", "llama_f16"), ("int8_verified", "llama_q8_0"), ("int8_verified", "int8")]
        if a.rounded:
            pairs += [("bf16_rounded", "llama_f16"), ("int8_rounded", "llama_q8_0"), ("bf16", "bf16_rounded"),
                      ("int8", "int8_rounded")]
        for mine, theirs in pairs:
            ratio = {key: spread([r[mine][key] / r[theirs][key] for r in results])
                     for key in ("tokens_per_s", "decode_per_s", "per_cpu_s")}
            print(f"  {mine} / {theirs}: tokens/s {ratio['tokens_per_s']}x, decode/s {ratio['decode_per_s']}x, "
                  f"tokens per CPU s {ratio['per_cpu_s']}x")
        reference = results[0]["fp32"]["tokens"]
        print("  greedy tokens equal to llmkit fp32's (first run): " + ", ".join(
            f"{name} {first_difference(results[0][name]['tokens'], reference)}" for name in sides if name != "fp32"))
        if warning := load_warning(loads, threads):
            print(warning)


def first_difference(a: list[int], b: list[int]) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return "all" if at is None else f"first {at}"


def shown(name: str, r: dict) -> dict:
    print(f"    {name}: {r['tokens_per_s']:.2f} tokens/s, decode {r['decode_per_s']:.2f}/s; load "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    return r


def quality(a) -> None:
    r = spawn(__file__, "quality", {"model": str(Path(a.model).resolve()), "prompts": a.prompts,
                                    "new_tokens": a.new_tokens, "windows": 16, "window": 256,
                                    "rounded": a.rounded, "prompt_set": a.prompt_set,
                                    "ggufs": quality_ggufs(a)}, a.threads)
    prompts = (f"{a.prompts} chat prompts x <= {a.new_tokens} tokens (batched)" if a.prompt_set == "chat" else
               f"{a.prompts} held-out text prompts of {PROMPT_TOKENS} tokens x {a.new_tokens} tokens (batch 1, no stop)")
    print(f"greedy replies of {prompts}, and held-out perplexity (16 x 256 tokens); load {os.getloadavg()[0]:.2f}")
    for kind in r:
        line = f"  {kind}:" + (f" perplexity {r[kind]['ppl']:.4f}" if "ppl" in r[kind] else "")
        if kind != "fp32":
            if "ppl" in r[kind]:
                line += f" ({100 * (r[kind]['ppl'] / r['fp32']['ppl'] - 1):+.3f}% of fp32's);"
            line += (f" replies equal to fp32's up to the stop {r[kind]['equal']}/{a.prompts}, all {a.new_tokens} "
                     f"tokens {r[kind]['strict']}/{a.prompts}; differences {json.dumps(r[kind]['differences'])}")
        print(line)


def quality_ggufs(a) -> dict:
    """{side: GGUF path} of llama.cpp's files given, for the text prompts (the chat set is batched
    through llmkit's template, which the binding's greedy loop does not take)."""
    if a.prompt_set != "text":
        return {}
    return {name: str(Path(path).resolve()) for name, path in (("llama_f16", a.gguf_f16), ("llama_q8_0", a.gguf_q8))
            if path}


def batch(a) -> None:
    from bench.generate import latest_step, prompt_batches
    from llmkit.checkpoints.loading import load_tokenizer

    tokenizer = load_tokenizer(latest_step(Path(a.model)))
    payload = {"model": str(Path(a.model).resolve()), "export": str(Path(a.export).resolve()),
               "batches": prompt_batches(tokenizer, a.batches + 1, 16), "new_tokens": 64,
               "stop_id": tokenizer.end_of_turn_id, "pad_id": tokenizer.pad_id, "greedy": False}
    runs = [(f"llmkit_{w}", lambda w=w: spawn(__file__, "batch", {**payload, "weights": w}, a.threads))
            for w in a.weights.split(",")]
    runs.append(("hf", lambda: spawn(REPO / "bench" / "generate.py", "run", {**payload, "side": "hf",
                                                                               "cache": "dynamic"}, a.threads)))
    results, loads = repeat(runs, a.reps)
    print(f"batch 16 x <= 64 sampled tokens, {a.batches} batches timed after a warm-up, {a.threads} thread(s), "
          f"{a.reps} runs; loads {', '.join(f'{b:.2f}->{e:.2f}' for b, e in loads)}")
    for name in results[0]:
        print(f"  {name:<12} tokens/s {spread([r[name]['tokens'] / r[name]['seconds'] for r in results])}")
    for name in results[0]:
        if name != "hf":
            ratios = [(r[name]["tokens"] / r[name]["seconds"]) / (r["hf"]["tokens"] / r["hf"]["seconds"]) for r in results]
            print(f"  {name} / transformers: {spread(ratios)}x")
    if warning := load_warning(loads, a.threads):
        print(warning)


def command(a) -> None:
    import subprocess
    import tempfile

    from bench.generate import PROMPTS, latest_step
    from llmkit.checkpoints.loading import load_tokenizer

    tokenizer = load_tokenizer(latest_step(Path(a.model)))
    work = Path(tempfile.mkdtemp(prefix="llmkit-command-bench-"))
    prompts = work / "prompts.jsonl"
    lines = PROMPTS.read_text(encoding="utf-8").splitlines()[:16 * a.batches]
    prompts.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "BENCH_THREADS": str(a.threads)}

    def timed(args: list[str], output: Path | None) -> dict:
        started = time.perf_counter()
        done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if done.returncode:
            sys.exit(f"{args[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
        if output is None:  # the transformers script's result, its last line
            return {"seconds": seconds, **json.loads(done.stdout.strip().splitlines()[-1])}
        records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
        return {"seconds": seconds, "tokens": sum(r["new_tokens"] for r in records), "completions": len(records)}

    def llmkit_side(weights: str) -> dict:
        out = work / f"llmkit-{weights}.jsonl"
        return shown_command(f"llmkit_{weights}", timed(
            [sys.executable, "-m", "llmkit", "generate", "--from", str(Path(a.model).resolve()), "--prompts", str(prompts),
             "--output", str(out), "--set", "batch_size=16", "max_new_tokens=64", "temperature=1.0", "chat=true",
             f"decode.weights={weights}"], out))

    hf_payload = {"export": str(Path(a.export).resolve()), "prompts": str(prompts), "new_tokens": 64,
                  "stop_id": tokenizer.end_of_turn_id}
    runs = [(f"llmkit_{w}", lambda w=w: llmkit_side(w)) for w in a.weights.split(",")]
    runs.append(("hf", lambda: shown_command("hf", timed(
        [sys.executable, __file__, "--child", "hf_command", json.dumps(hf_payload)], None))))
    results, loads = repeat(runs, a.reps)
    print(f"whole commands, {16 * a.batches} chat prompts (batches of 16) x <= 64 sampled tokens, {a.threads} "
          f"thread(s), {a.reps} runs; loads {', '.join(f'{b:.2f}->{e:.2f}' for b, e in loads)}")
    for name in results[0]:
        print(f"  {name:<12} seconds {spread([r[name]['seconds'] for r in results])}  new tokens "
              f"{spread([r[name]['tokens'] for r in results], '{:.0f}')}")
    for name in results[0]:
        if name != "hf":
            print(f"  transformers seconds / {name} seconds: "
                  f"{spread([r['hf']['seconds'] / r[name]['seconds'] for r in results])}x")
    if warning := load_warning(loads, a.threads):
        print(warning)


def shown_command(name: str, r: dict) -> dict:
    print(f"    {name}: {r['seconds']:.2f} s, {r['tokens']} new tokens; load {os.getloadavg()[0]:.2f}", flush=True)
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("what", nargs="?", help="speed | quality | batch | command")
    parser.add_argument("--model", help="an llmkit checkpoint run (e.g. WS/smollm2)")
    parser.add_argument("--gguf-f16")
    parser.add_argument("--gguf-q8")
    parser.add_argument("--export", help="the run's `llmkit export` folder (batch)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--prompt-set", default="chat", choices=["chat", "text"],
                        help="quality: chat prompts (batched, up to the stop) or held-out text windows of "
                             f"{PROMPT_TOKENS} tokens after the speed bench's (batch 1, every new token)")
    parser.add_argument("--weights", default="fp32,int8", help="batch: llmkit's weights, comma-separated")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--verified", action="store_true",
                        help="speed: add bf16_verified and int8_verified (greedy tokens checked by float32)")
    parser.add_argument("--rounded", action="store_true",
                        help="speed, quality: also bf16/int8 with the rows rounded as the weights (the kernels before)")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        return child_main(CHILDREN, a.child, a.what)  # the payload, the one positional given
    if not a.model or a.what not in ("speed", "quality", "batch", "command"):
        return print("skip: needs speed|quality|batch|command and --model RUN (e.g. make smollm2)")
    if a.what != "speed":
        a.threads = int(a.threads.split(",")[0])
    {"speed": speed, "quality": quality, "batch": batch, "command": command}[a.what](a)


if __name__ == "__main__":
    main()
