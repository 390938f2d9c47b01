"""Qwen3.5 decoding on CPU: llmkit's `generate` (KV cache for the full-attention layers, a conv and
delta-rule state for the Gated DeltaNet ones) against transformers' `generate`, on a ~100M-parameter
random Qwen3.5 text model, fp32, greedy.

The model is transformers' own `Qwen3_5ForCausalLM` from a `Qwen3_5TextConfig` of realistic head
shapes (hidden 640, 12 layers, `layer_types` 3 linear : 1 full; full attention 8 query heads and 2
key/value heads of 256 with a quarter rotated and the output gate; Gated DeltaNet 4 key heads and 8
value heads of 128, conv kernel 4; SwiGLU 2048; vocabulary 32,000, tied: 105M parameters), saved
with a byte-level BPE tokenizer (trained here on the standard library's sources) and a ChatML
template, then read by `llmkit import` into a workspace. Built once under --work.

Two timings, each in fresh processes with the same thread count, alternating the order per repetition:
- inner loop: both sides load their model, decode the batch once as a warm-up, then time
  `llmkit.model.decoding.generate` / `model.generate` on the same left-padded batch of `--batch` chat
  prompts of different lengths (token ids made once by the parent) x `--new-tokens`, greedy, stop
  token `<|im_end|>`. The greedy tokens of the two sides must be equal (printed).
- whole command: `llmkit generate --from RUN --prompts FILE --set greedy=true ...` against the
  script a transformers user writes (AutoTokenizer + AutoModelForCausalLM, the chat template,
  `generate`, decode), wall clock from spawn to exit (interpreter start, imports, loading,
  tokenising included); the completions of the two must be equal (printed).
Each figure is the median [min-max] over `--reps`; the 1-minute load average is printed around
each repetition.

    python bench/decode_qwen35.py [--work /tmp/llmkit-qwen35-bench] [--threads 1] [--reps 3]
                                  [--batch 16] [--new-tokens 64]
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
import random  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from bench.steps import child_main, load_warning, repeat, spawn, spread  # noqa: E402

SHAPE = dict(vocab_size=32000, hidden_size=640, intermediate_size=2048, num_hidden_layers=12,
             num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=4,
             linear_num_value_heads=8, linear_key_head_dim=128, linear_value_head_dim=128,
             linear_conv_kernel_dim=4, max_position_embeddings=4096, tie_word_embeddings=True)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
WORDS = ("the model reads every token once and keeps a state of fixed size while attention layers keep "
         "their keys and values so a long prompt costs the linear layers nothing more per new token "
         "delta rule chunk decay gate conv kernel value head query batch prompt reply stage export").split()


def build(work: Path) -> dict:
    """The transformers folder, its llmkit import and the prompts file under `work` (made once)."""
    hf_dir, ws = work / "hf", work / "ws"
    if not (ws / "qwen35").is_dir():
        import torch
        import transformers
        from transformers import PreTrainedTokenizerFast

        torch.manual_seed(0)
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**SHAPE)).eval()
        model.save_pretrained(hf_dir)
        PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(), chat_template=CHATML, eos_token="<|im_end|>",
                                pad_token="<|endoftext|>").save_pretrained(hf_dir)
        subprocess.run([sys.executable, "-m", "llmkit", "import", "--from", str(hf_dir), "--out", "qwen35", "-w", str(ws)],
                       check=True, cwd=REPO)
    return {"hf": str(hf_dir), "run": str(ws / "qwen35")}


def train_tokenizer():
    """A Qwen-like byte-level BPE of SHAPE's vocabulary, trained on the standard library's sources."""
    import sysconfig

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    split = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    files = sorted(str(p) for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    trainer = trainers.BpeTrainer(vocab_size=SHAPE["vocab_size"], special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(files, trainer)
    if tok.get_vocab_size() != SHAPE["vocab_size"]:
        raise SystemExit(f"the tokenizer reached {tok.get_vocab_size()} pieces, not {SHAPE['vocab_size']}")
    return tok


def prompt_texts(n: int) -> list[str]:
    """n user messages of different lengths (8 to ~150 words), the same every run."""
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(8 + 10 * i)) for i in range(n)]


# -- the children ------------------------------------------------------------------------------

def inner(p: dict) -> dict:
    """One side's warm-up and timed `generate` of the batch; its new tokens up to each stop token."""
    import torch

    ids, mask = torch.tensor(p["ids"]), torch.tensor(p["mask"])
    if p["side"] == "llmkit":
        from llmkit.model.decoding import generate
        from llmkit.checkpoints.loading import load
        from llmkit.model.packed_linear import packed_linears

        model, _ = load(p["run"], device="cpu")
        model.eval()
        packing = packed_linears(model)  # once for every batch, as `llmkit generate` packs
        packing.__enter__()

        def run():
            return generate(model, ids, p["new_tokens"], greedy=True, eos_id=p["stop_id"], attention_mask=mask)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(p["hf"], dtype=torch.float32).eval()

        @torch.no_grad()
        def run():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=p["new_tokens"], do_sample=False,
                                  eos_token_id=p["stop_id"], pad_token_id=p["pad_id"])
    run()
    started, cpu_started = time.perf_counter(), time.process_time()
    out = run()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    new = [up_to_stop(row, p["stop_id"]) for row in out[:, ids.shape[1]:].tolist()]
    steps = out.shape[1] - ids.shape[1]
    lengths = mask.sum(-1).tolist()
    if p["side"] == "llmkit":  # prompts of very different lengths prefill in groups (llmkit.model.decoding.prefill)
        from llmkit.model.decoding import length_groups

        prompt_positions = sum(len(g) * max(lengths[i] for i in g) for g in length_groups(lengths))
    else:
        prompt_positions = ids.numel()
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "tokens": sum(map(len, new)), "greedy": new,
            "prompt_positions": prompt_positions,
            "decode_positions": sum(map(len, new)) if p["side"] == "llmkit" else len(new) * steps}


def up_to_stop(row: list[int], stop_id: int) -> list[int]:
    return row[:row.index(stop_id) + 1] if stop_id in row else row


def hf_command(p: dict) -> dict:
    """What a transformers user runs: tokenizer and model from the folder, the chat template, generate, decode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(p["hf"], padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(p["hf"], dtype=torch.float32).eval()
    prompts = [json.loads(line)["prompt"] for line in Path(p["prompts"]).read_text().splitlines()]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
             for t in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=p["new_tokens"], do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    completions = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    for prompt, completion in zip(prompts, completions):
        print(f">>> {prompt}\n{completion}\n")
    return {"completions": completions}


CHILDREN = {"inner": inner, "hf_command": hf_command}


def command(p: dict, side: str, threads: int) -> dict:
    """The whole command of one side, timed from spawn to exit; its completions."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out = Path(p["work"]) / f"{side}-completions.jsonl"
    if side == "llmkit":
        args = [sys.executable, "-m", "llmkit", "generate", "--from", p["run"], "--prompts", p["prompts"],
                "--output", str(out), "--set", "greedy=true", "--set", f"max_new_tokens={p['new_tokens']}",
                "--set", f"batch_size={p['batch']}", "--set", "chat=true"]
    else:
        args = [sys.executable, __file__, "--child", "hf_command", json.dumps(p)]
        env["BENCH_THREADS"] = str(threads)
    started = time.perf_counter()
    done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"{side} command failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    if side == "llmkit":
        completions = [json.loads(line)["completion"] for line in out.read_text().splitlines()]
    else:
        completions = json.loads(done.stdout.strip().splitlines()[-1])["completions"]
    return {"seconds": seconds, "completions": completions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--work", default="/tmp/llmkit-qwen35-bench", help="where the model is built (once)")
    parser.add_argument("--batch", type=int, default=16, help="prompts, decoded as one batch")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", choices=["inner", "command"], help="run one of the two timings")
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                        help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("payload", nargs="?", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        return child_main(CHILDREN, a.child, a.payload)
    if a.quick:
        a.batch, a.new_tokens, a.reps = 4, 8, 1

    from llmkit.model.decoding import left_pad
    from llmkit.generation import encode_prompt
    from llmkit.checkpoints.loading import load_tokenizer

    work = Path(a.work)
    paths = build(work)
    run = Path(paths["run"])
    tokenizer = load_tokenizer(run / (run / "latest").read_text().strip())
    texts = prompt_texts(a.batch)
    prompts_file = work / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    ids, mask = left_pad([encode_prompt(tokenizer, t, True) for t in texts], tokenizer.pad_id)
    payload = {**paths, "work": str(work), "prompts": str(prompts_file), "ids": ids.tolist(), "mask": mask.tolist(),
               "new_tokens": a.new_tokens, "batch": a.batch, "stop_id": tokenizer.end_of_turn_id,
               "pad_id": tokenizer.pad_id}
    lengths = mask.sum(-1).tolist()
    print(f"Qwen3.5 random model {SHAPE}; {a.batch} chat prompts of {min(lengths)}-{max(lengths)} tokens "
          f"({sum(lengths)} in all) x {a.new_tokens} new tokens, greedy, fp32, {a.threads} threads", flush=True)
    runs = []
    if a.only != "command":
        runs += [(f"inner_{side}", lambda side=side: shown(f"inner {side}", spawn(
            __file__, "inner", {**payload, "side": side}, a.threads))) for side in ("llmkit", "hf")]
    if a.only != "inner":
        runs += [(f"command_{side}", lambda side=side: shown(f"command {side}", command(payload, side, a.threads)))
                 for side in ("llmkit", "hf")]
    results, loads = repeat(runs, a.reps)
    report(results, loads, a.threads)


def shown(name: str, r: dict) -> dict:
    """r, printed as soon as its run ends (a long bench on a loaded machine leaves a trace)."""
    rate = (f" (CPU {r['cpu_seconds']:.2f} s), {r['tokens']} tokens ({r['tokens'] / r['seconds']:.1f}/s)"
            if "tokens" in r else "")
    print(f"  {name}: {r['seconds']:.2f} s{rate}; load {os.getloadavg()[0]:.2f}", flush=True)
    return r


def report(results: list[dict], loads, threads: int) -> None:
    for i, (r, (before, after)) in enumerate(zip(results, loads), 1):
        print(f"  rep {i}: load {before:.2f} -> {after:.2f}; " + "; ".join(
            f"{k} {v['seconds']:.2f} s" + (f" (CPU {v['cpu_seconds']:.2f} s, {v['tokens']} tokens, positions computed: prompt "
                                          f"{v['prompt_positions']}, decode {v['decode_positions']})"
                                          if "tokens" in v else "") for k, v in r.items()))
    if "inner_llmkit" in results[0]:
        for side in ("llmkit", "hf"):
            runs = [r[f"inner_{side}"] for r in results]
            print(f"  inner {side:<6} tokens/s {spread([v['tokens'] / v['seconds'] for v in runs])}, per CPU "
                  f"second {spread([v['tokens'] / v['cpu_seconds'] for v in runs])}")
        ratios = [(r["inner_llmkit"]["tokens"] / r["inner_llmkit"]["seconds"])
                  / (r["inner_hf"]["tokens"] / r["inner_hf"]["seconds"]) for r in results]
        cpu_ratios = [(r["inner_llmkit"]["tokens"] / r["inner_llmkit"]["cpu_seconds"])
                      / (r["inner_hf"]["tokens"] / r["inner_hf"]["cpu_seconds"]) for r in results]
        same = all(r["inner_llmkit"]["greedy"] == r["inner_hf"]["greedy"] for r in results)
        print(f"  inner loop: llmkit / transformers {spread(ratios)}x tokens/s, {spread(cpu_ratios)}x tokens per "
              f"CPU second; greedy tokens equal: {same}")
    if "command_llmkit" in results[0]:
        for side in ("llmkit", "hf"):
            print(f"  command {side:<6} seconds {spread([r[f'command_{side}']['seconds'] for r in results])}")
        ratios = [r["command_hf"]["seconds"] / r["command_llmkit"]["seconds"] for r in results]
        same = all(r["command_llmkit"]["completions"] == r["command_hf"]["completions"] for r in results)
        print(f"  whole command: transformers seconds / llmkit seconds {spread(ratios)}x; completions equal: {same}")
    if warning := load_warning(loads, threads):
        print(warning)


if __name__ == "__main__":
    main()
