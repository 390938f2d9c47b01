"""GRPO steps/s: `llmkit ppo --set algo=grpo` against TRL's `GRPOTrainer` on the same model,
prompts, reward and batch (CPU).

One tiny llmkit model (the `tiny` preset, random weights; tokenizer trained on the prompts) is
exported with `llmkit export`, so TRL trains the very same weights as a transformers
`LlamaForCausalLM`, with the same tokenizer, chat template and stop tokens (<|end|>, </s>), on
the same prompts (the demo's `prompts_train.jsonl`, reverse a spelled-out word). The reward is the same Python
function on both sides: the similarity of the reply to the prompt's answer, 1 − edit distance /
length (`llmkit.rewards.verify.answer_similarity`; llmkit's `reward=verify partial_credit=true`, TRL a
reward function calling it).

Work per generation, equal on both sides (both settings are printed):
- PROMPTS prompts × GROUP completions (llmkit prompts_per_rollout × group_size; TRL
  per_device_train_batch_size = generation_batch_size = PROMPTS × GROUP, num_generations = GROUP),
  sampled at temperature 1 (no top-k/top-p) for at most NEW_TOKENS tokens, with a KV cache on both
  (transformers' `generate` with its dynamic cache),
- the no-grad forwards each side needs beside the updates: TRL skips the reference at its default
  β = 0 and makes a pass for the sampling policy's log-probs when num_iterations > 1; llmkit skips
  the reference at β = 0 too, and makes no sampling pass while each update is one optimizer step
  (the first update runs on the sampling parameters: its own log-probs, kept, serve the second).
  So at β 0.04 and 2 updates (llmkit's defaults) TRL makes two no-grad forwards per generation
  and llmkit one; at `--beta 0 --epochs 1` (TRL's defaults) neither makes any,
- EPOCHS optimizer steps, each a forward + backward of all the completions in one micro-batch
  (llmkit ppo_epochs, micro_batch_size = PROMPTS × GROUP, grad_accum 1; TRL num_iterations,
  gradient_accumulation_steps = steps_per_generation = 1); loss_type dapo, scale_rewards group,
  clip ε 0.2, AdamW (0.9, 0.999), no weight decay, grad-norm clip 1.0, constant lr, fp32, no
  activation checkpointing (TRL's defaults are bf16 autocast and activation checkpointing: set
  here to fp32 and off, as llmkit runs).

Timing, as bench/dpo.py does: each run is a fresh process that stamps the end of every optimizer
step (llmkit: its metrics record; TRL: `on_step_end`); the rate is the timed steps over the time
from the end of the first WARMUP rollouts (each EPOCHS steps: the first generation, its scoring
and updates) to the end of the last, so whole rollouts are timed and process start, imports,
model loading, trainer set-up (TRL loads its reference model there, llmkit copies the policy
once) and the first rollout are excluded on both sides; a second figure takes a generation's
steps over the median time of a generation and its updates (robust to a burst of other work on
the machine). `--reps` repetitions, alternating the order of the two runs; median [min–max] of
each rate and of the per-repetition ratio; the 1-minute load average before and after each
repetition. One thread per run by default: on a 2-core machine shared with other jobs, a run at
2 threads that meets one slows 10-20x (each parallel region waits for a descheduled thread),
at 1 thread by its share of the CPU at most; the tiny model gains ~1.3x from a second thread.

Code reward (`--reward code`; the default `--reward similarity` is the above): the prompts are
32 small Python tasks made here (`CODE_TASKS`: "Write a Python function add(a, b) that returns
their sum", 2-3 asserts each), the reward the pass rate of the reply's code on the row's tests,
run in llmkit's sandbox (`llmkit.rewards.code.code_reward`: a `python -I` child per completion,
four at a time, with its rlimits, namespaces and audit hook), so its cost is in both sides' time.
One function object on both sides: llmkit's `reward=code` resolves to `code_reward` itself, and TRL
is given that same function as its reward function (TRL's signature: prompts, completions,
completion_ids, **the dataset's columns); the tests travel as each side's `tests` column (a string
of asserts, as ingest keeps it). Each child counts the completions the sandbox scored and sums
their scores (a counter wrapped around `code_outcomes`, which `code_reward` calls), printed per
side, so a side that skipped scoring would show.

SmolLM2 mode (`--model WS/smollm2 --export HF_DIR`): the imported SmolLM2-135M-Instruct run and
its `llmkit export` folder instead of the random tiny model (its own tokenizer and chat template),
LoRA r `--lora-r` (16 there) on every linear layer of the blocks on both sides (llmkit
`lora.target=all-linear`, TRL a peft `LoraConfig` on the same seven projections), α 32, no dropout.

Low-precision rollouts (`--decode-weights bf16|f16|int8`): llmkit samples through copies of the
policy in those weights (`--set decode.weights=…`; training, log-probs and KL stay fp32), TRL as
ever in fp32. `--base-products bf16` multiplies llmkit's frozen LoRA base through bf16 copies too
(`--set lora.base_products=bf16`; the adapters, norms, attention, loss and optimizer stay fp32).
Either way each repetition then runs llmkit at fp32 too, same seed, so beside the speed-ups
(over TRL and over llmkit fp32) the two llmkit runs' per-step reward and KL are printed side by
side with their largest difference, and the manifest's `stats.rollout_weights` of each (a CPU
without the instructions falls back to fp32, which must not pass for a low-precision figure).

    python bench/grpo.py [--prompts 4] [--group 4] [--new-tokens 32] [--epochs 2] [--beta 0.04]
                         [--rollouts 10] [--warmup 1] [--threads 1] [--reps 3]
    python bench/grpo.py --model WS/smollm2 --export HF_DIR --prompts 8 --group 4 --new-tokens 64 \
                         [--epochs 1 --beta 0] [--rollouts 3] [--warmup 1] [--threads 1] [--reps 3]
                         [--decode-weights fp32|bf16|f16|int8] [--base-products fp32|bf16]
                         [--reward similarity|code]
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
import warnings  # noqa: E402

from bench.dpo import (child_main, llmkit, llmkit_step_ends, load_warning, rates,  # noqa: E402
                       repeat, spawn, spread, step_end_timer, write_random_run)

RATE = "{:.4f}"  # a 135M model makes hundredths of a step per second
PROMPTS = REPO / "recipes/demo/data/tasks/prompts_train.jsonl"
LR = 1e-5
LORA_ALPHA = 32
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# --reward code: (signature, what it returns, tests as a string of asserts) - deterministic, the
# same rows on both sides
CODE_TASKS = [
    ("add(a, b)", "the sum of a and b", "assert add(1, 2) == 3\nassert add(-4, 4) == 0\nassert add(10, 5) == 15"),
    ("sub(a, b)", "a minus b", "assert sub(5, 3) == 2\nassert sub(0, 7) == -7"),
    ("mul(a, b)", "the product of a and b", "assert mul(3, 4) == 12\nassert mul(-2, 5) == -10\nassert mul(0, 9) == 0"),
    ("square(x)", "x squared", "assert square(3) == 9\nassert square(-5) == 25"),
    ("cube(x)", "x cubed", "assert cube(2) == 8\nassert cube(-3) == -27"),
    ("is_even(n)", "True if n is even, else False", "assert is_even(4) is True\nassert is_even(7) is False\nassert is_even(0) is True"),
    ("is_odd(n)", "True if n is odd, else False", "assert is_odd(3) is True\nassert is_odd(10) is False"),
    ("maximum(a, b)", "the larger of a and b", "assert maximum(3, 8) == 8\nassert maximum(-1, -6) == -1"),
    ("minimum(a, b)", "the smaller of a and b", "assert minimum(3, 8) == 3\nassert minimum(-1, -6) == -6"),
    ("absolute(x)", "the absolute value of x", "assert absolute(-7) == 7\nassert absolute(4) == 4\nassert absolute(0) == 0"),
    ("reverse_string(s)", "the string s reversed", "assert reverse_string('abc') == 'cba'\nassert reverse_string('') == ''"),
    ("list_sum(xs)", "the sum of the numbers in the list xs", "assert list_sum([1, 2, 3]) == 6\nassert list_sum([]) == 0"),
    ("list_max(xs)", "the largest number in the non-empty list xs", "assert list_max([3, 9, 2]) == 9\nassert list_max([-5, -2]) == -2"),
    ("count_vowels(s)", "the number of vowels (a, e, i, o, u) in the lowercase string s",
     "assert count_vowels('hello') == 2\nassert count_vowels('sky') == 0\nassert count_vowels('aeiou') == 5"),
    ("factorial(n)", "n factorial", "assert factorial(0) == 1\nassert factorial(5) == 120"),
    ("fibonacci(n)", "the n-th Fibonacci number, with fibonacci(0) == 0 and fibonacci(1) == 1",
     "assert fibonacci(0) == 0\nassert fibonacci(1) == 1\nassert fibonacci(10) == 55"),
    ("is_palindrome(s)", "True if the string s reads the same backwards",
     "assert is_palindrome('racecar') is True\nassert is_palindrome('abc') is False"),
    ("average(xs)", "the mean of the non-empty list of numbers xs", "assert average([1, 2, 3]) == 2\nassert average([4]) == 4"),
    ("to_upper(s)", "the string s in upper case", "assert to_upper('abc') == 'ABC'\nassert to_upper('Hi!') == 'HI!'"),
    ("count_char(s, c)", "how many times the character c occurs in the string s",
     "assert count_char('banana', 'a') == 3\nassert count_char('xyz', 'a') == 0"),
    ("first(xs)", "the first item of the non-empty list xs", "assert first([7, 8]) == 7\nassert first(['a']) == 'a'"),
    ("last(xs)", "the last item of the non-empty list xs", "assert last([7, 8]) == 8\nassert last(['a']) == 'a'"),
    ("double_all(xs)", "a list of every number of xs doubled", "assert double_all([1, 2, 3]) == [2, 4, 6]\nassert double_all([]) == []"),
    ("evens(xs)", "the even numbers of the list xs, in order", "assert evens([1, 2, 3, 4]) == [2, 4]\nassert evens([1, 3]) == []"),
    ("word_count(s)", "the number of words in the string s, split on whitespace",
     "assert word_count('hello big world') == 3\nassert word_count('') == 0"),
    ("celsius_to_fahrenheit(c)", "the temperature c in degrees Fahrenheit",
     "assert celsius_to_fahrenheit(0) == 32\nassert celsius_to_fahrenheit(100) == 212"),
    ("is_positive(x)", "True if x is greater than zero", "assert is_positive(3) is True\nassert is_positive(-2) is False\nassert is_positive(0) is False"),
    ("power(base, exp)", "base raised to the power exp", "assert power(2, 10) == 1024\nassert power(5, 0) == 1"),
    ("gcd(a, b)", "the greatest common divisor of the positive integers a and b", "assert gcd(12, 18) == 6\nassert gcd(7, 5) == 1"),
    ("is_prime(n)", "True if n is a prime number", "assert is_prime(7) is True\nassert is_prime(9) is False\nassert is_prime(2) is True"),
    ("repeat(s, n)", "the string s repeated n times", "assert repeat('ab', 3) == 'ababab'\nassert repeat('x', 0) == ''"),
    ("length(xs)", "the number of items in the list xs", "assert length([1, 2, 3]) == 3\nassert length([]) == 0"),
]


def timings(ends: list[float], steps: int, warmup_steps: int, epochs: int) -> dict:
    """The rates of the timed steps (`bench.dpo.rates`, a cycle = one generation's steps), and
    the median seconds of a generation's first step (sampling, scoring, the two no-grad forwards
    and an update) and of its other steps (an update alone)."""
    step_s = [b - a for a, b in zip(ends[warmup_steps - 1:], ends[warmup_steps:])]
    first = [s for i, s in enumerate(step_s) if i % epochs == 0]
    rest = [s for i, s in enumerate(step_s) if i % epochs]
    return {**rates(ends, warmup_steps, steps, epochs), "generation_step_s": statistics.median(first),
            "update_step_s": statistics.median(rest) if rest else None}


def code_rows(n: int) -> list[dict]:
    """n prompt rows of CODE_TASKS (in order, cycled past 32), each with its asserts as `tests`."""
    rows = []
    for i in range(n):
        signature, returns, tests = CODE_TASKS[i % len(CODE_TASKS)]
        rows.append({"prompt": f"Write a Python function {signature} that returns {returns}. "
                               "Reply with the code in a ```python block.", "tests": tests})
    return rows


def prompt_rows(reward: str, n: int) -> list[dict]:
    """The first n prompt rows both sides train on: the demo's reversal tasks (`similarity`,
    with their `answer`) or the Python tasks (`code`, with their `tests`)."""
    if reward == "code":
        return code_rows(n)
    return [json.loads(line) for line in PROMPTS.read_text(encoding="utf-8").splitlines()[:n]]


def build_inputs(ws: Path, n_prompts: int, threads: int, a) -> Path:
    """The prompts as a dataset, a tokenizer trained on them, a random `tiny` model as a
    checkpoint run `base`, and its transformers export (SmolLM2 mode: the prompts alone)."""
    rows = prompt_rows(a.reward, n_prompts)
    data = ws.parent / "prompts.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    llmkit(ws, "ingest", str(data), "--kind", "prompt", "--out", "prompts", threads=threads)
    if a.model:
        return Path(a.export).resolve()
    llmkit(ws, "tokenizer", "--in", "prompts", "--set", "vocab_size=320", threads=threads)
    write_random_run(ws, "base")
    llmkit(ws, "export", "--from", "base", "--out", "hf", "--set", "probe=false", threads=threads)
    return ws / "hf"


def llmkit_settings(a, steps: int, weights: str, base: str = "fp32") -> list[str]:
    reward = ["reward=code"] if a.reward == "code" else ["reward=verify", "partial_credit=true"]
    return ["algo=grpo", f"decode.weights={weights}", *reward,
            f"prompts_per_rollout={a.prompts}",
            f"group_size={a.group}", f"micro_batch_size={a.prompts * a.group}", "grad_accum=1",
            f"ppo_epochs={a.epochs}", f"max_new_tokens={a.new_tokens}", f"kl_coef={a.beta}",
            "loss_type=dapo", "scale_rewards=group", "clip_range=0.2", "temperature=1.0",
            f"lr={LR}", f"min_lr={LR}", "warmup_steps=0", "weight_decay=0", "betas=[0.9,0.999]",
            "grad_clip=1.0", "precision=fp32", "activation_checkpointing=false",
            f"max_steps={steps}", "log_every=1", "eval_every=0", "eval_records=0",
            "eval_fraction=0", "seq_len=128", "seed=0",
            *([f"lora.r={a.lora_r}", f"lora.alpha={LORA_ALPHA}", "lora.dropout=0", "lora.target=all-linear",
               f"lora.base_products={base}"]
              if a.lora_r else [])]


def count_sandbox_runs() -> dict:
    """{"completions": how many completions the code reward's sandbox scored in this process,
    "score": their summed scores}: a counter around `llmkit.rewards.code.code_outcomes`, which
    `code_reward` looks up at each call (the reward function itself is left as it is)."""
    from llmkit.rewards import code

    counts, outcomes = {"completions": 0, "score": 0.0}, code.code_outcomes

    def counted(*args, **kwargs):
        results = outcomes(*args, **kwargs)
        counts["completions"] += len(results)
        counts["score"] += sum(o.score for o in results)
        return results

    code.code_outcomes = counted
    return counts


def llmkit_child(args: list[str]) -> dict:
    sandbox = count_sandbox_runs()
    return {**llmkit_step_ends(args), "sandbox": sandbox}


def run_llmkit(ws: Path, a, steps: int, warmup_steps: int, weights: str, base: str = "fp32") -> dict:
    out = f"grpo_{weights}_{base}"
    args = ["ppo", "--from", str(Path(a.model).resolve()) if a.model else "base", "--in", "prompts", "--out",
            out, "--force",
            *[x for s in llmkit_settings(a, steps, weights, base) for x in ("--set", s)]]
    result = spawn(__file__, "llmkit", args, a.threads, ws)
    ends = result["ends"]
    records = [json.loads(line) for line in (ws / out / "metrics.jsonl").open()]
    rollouts = records[::a.epochs]  # the rollout metrics repeat on each of its steps
    stats = json.loads((ws / out / "manifest.json").read_text())["stats"]
    return {**timings(ends, steps, warmup_steps, a.epochs),
            "completion_length": statistics.mean(r["response_length"] for r in rollouts),
            "reward": [rollouts[0]["reward_mean"], rollouts[-1]["reward_mean"]],
            "step_reward": [r["reward_mean"] for r in records],
            "step_kl": [r.get("kl") for r in records],  # absent at β 0 (no reference)
            "rollout_weights": stats["rollout_weights"], "base_products": stats.get("base_products", "-"),
            "sandbox": result["sandbox"]}


def trl_config(p: dict, out: str):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out, per_device_train_batch_size=p["prompts"] * p["group"],
        gradient_accumulation_steps=1, steps_per_generation=1, num_generations=p["group"],
        num_iterations=p["epochs"], max_completion_length=p["new_tokens"], beta=p["beta"],
        loss_type="dapo", scale_rewards="group", epsilon=0.2, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, bf16=False,
        gradient_checkpointing=False, max_steps=p["steps"], logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True,
        log_completions=False)


def trl_child(p: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOTrainer

    from llmkit.rewards.code import code_reward
    from llmkit.rewards.verify import answer_similarity

    def similarity(completions, answer, **kwargs):
        return [answer_similarity(c[-1]["content"] if isinstance(c, list) else c, str(a))
                for c, a in zip(completions, answer)]

    sandbox = count_sandbox_runs()
    rows = prompt_rows(p["reward"], p["n_prompts"])
    column = "tests" if p["reward"] == "code" else "answer"  # the reward's column, as TRL passes it
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": r["prompt"]}] for r in rows],
                                 column: [r[column] for r in rows]})
    model = AutoModelForCausalLM.from_pretrained(p["hf_dir"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(p["hf_dir"])
    timer = step_end_timer()
    peft_config = None
    if p.get("lora_r"):
        import peft

        peft_config = peft.LoraConfig(r=p["lora_r"], lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                      target_modules=TARGETS, task_type="CAUSAL_LM")
    with tempfile.TemporaryDirectory() as out:
        reward = code_reward if p["reward"] == "code" else similarity  # code: llmkit's reward=code itself
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=trl_config(p, out),
                              train_dataset=dataset, processing_class=tokenizer, callbacks=[timer],
                              peft_config=peft_config)
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    generations = [h for h in trainer.state.log_history if "reward" in h]  # logged once per generation
    return {"ends": timer.ends, "reference_model": trainer.ref_model is not None,
            "completion_length": statistics.mean(h["completions/mean_length"] for h in generations),
            "reward": [generations[0]["reward"], generations[-1]["reward"]], "sandbox": sandbox}


def run_trl(hf_dir: Path, a, n_prompts: int, steps: int, warmup_steps: int) -> dict:
    payload = {"hf_dir": str(hf_dir), "n_prompts": n_prompts, "steps": steps, "prompts": a.prompts,
               "group": a.group, "epochs": a.epochs, "new_tokens": a.new_tokens, "beta": a.beta,
               "lora_r": a.lora_r, "reward": a.reward}
    result = spawn(__file__, "trl", payload, a.threads)
    return {**result, **timings(result.pop("ends"), steps, warmup_steps, a.epochs)}


CHILDREN = {"llmkit": llmkit_child, "trl": trl_child}


def side_by_side(low: list, fp32: list) -> tuple[str, str]:
    """Per-step values of the low-precision and the fp32 run as `low/fp32`, and their largest
    difference ("n/a" where the runs log none, e.g. KL at β 0)."""
    if any(v is None for v in low + fp32):
        return "n/a", "n/a"
    pairs = " ".join(f"{x:.3f}/{y:.3f}" for x, y in zip(low, fp32))
    return pairs, f"{max(abs(x - y) for x, y in zip(low, fp32)):.4f}"


def low_precision(a) -> str:
    """llmkit's side's name: its rollout weights and LoRA base products where not fp32 ("fp32" when
    both are)."""
    parts = ([a.decode_weights] if a.decode_weights != "fp32" else []) + \
        ([f"{a.base_products} base"] if a.base_products != "fp32" else [])
    return " + ".join(parts) or "fp32"


def print_against_fp32(results: list[dict], low: str) -> None:
    """The low-precision runs' per-step reward and KL beside the fp32 runs' of the same seed."""
    print(f"  per-step reward and KL, llmkit {low} / fp32 (same seed); largest difference:")
    for i, r in enumerate(results, 1):
        low, fp32 = r["llmkit"], r["llmkit_fp32"]
        reward, reward_diff = side_by_side(low["step_reward"], fp32["step_reward"])
        kl, kl_diff = side_by_side(low["step_kl"], fp32["step_kl"])
        print(f"  rep {i}: stats.rollout_weights {low['rollout_weights']} / {fp32['rollout_weights']}, "
              f"stats.base_products {low['base_products']} / {fp32['base_products']}; "
              f"reward {reward} (max diff {reward_diff}); KL {kl} (max diff {kl_diff})")


def print_sandbox_counts(results: list[dict], steps: int) -> None:
    """Per repetition and side: the completions the code reward's sandbox scored (every
    generation's, warm-up included) and their mean score."""
    print(f"  code reward, completions the sandbox scored over the {steps} steps and their mean score:")
    for i, r in enumerate(results, 1):
        sides = "; ".join(f"{name} {s['completions']} (mean {s['score'] / max(1, s['completions']):.3f})"
                          for name, s in ((k, v["sandbox"]) for k, v in r.items()))
        print(f"  rep {i}: {sides}")


def printed_run(name: str, r: dict) -> dict:
    """r, printed as soon as its run ends (a long bench on a loaded machine leaves a trace)."""
    import os

    print(f"  {name}: {r['rate']:.4f} steps/s (median generation {r['median_rate']:.4f}); "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per generation")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=32, help="completion length bound")
    parser.add_argument("--epochs", type=int, default=2, help="optimizer steps per generation")
    parser.add_argument("--beta", type=float, default=0.04, help="KL coefficient (0: no reference)")
    parser.add_argument("--rollouts", type=int, default=10, help="generations timed")
    parser.add_argument("--warmup", type=int, default=1, help="first generations left out")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads per run (1: a job elsewhere on a 2-core machine costs a run "
                             "its share of the CPU, not 10-20x as at 2)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (median and spread reported)")
    parser.add_argument("--decode-weights", default="fp32", choices=["fp32", "bf16", "f16", "int8"],
                        help="llmkit's rollout weights (not fp32: llmkit also runs at fp32 to compare)")
    parser.add_argument("--base-products", default="fp32", choices=["fp32", "bf16"],
                        help="llmkit's LoRA base products (lora.base_products; bf16: llmkit also runs "
                             "at fp32 to compare; TRL stays fp32)")
    parser.add_argument("--reward", default="similarity", choices=["similarity", "code"],
                        help="similarity: the reversal prompts' edit similarity; code: Python tasks "
                             "scored by llmkit's sandboxed code reward on both sides")
    parser.add_argument("--model", help="an llmkit checkpoint run (SmolLM2 mode, e.g. WS/smollm2)")
    parser.add_argument("--export", help="--model's `llmkit export` folder")
    parser.add_argument("--lora-r", type=int, default=None, help="LoRA rank (default: 16 with --model, else 0)")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("payload", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                        help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    a = parser.parse_args()
    if a.child:
        return child_main(CHILDREN, a.child, a.payload)
    if a.quick:
        a.rollouts, a.warmup, a.reps, a.new_tokens = 2, 1, 1, 16
    if a.warmup < 1 or a.rollouts < 1 or a.reps < 1 or a.group < 2:
        parser.error("need --warmup >= 1, --rollouts >= 1, --reps >= 1 and --group >= 2")
    if bool(a.model) != bool(a.export):
        parser.error("--model and --export go together")
    if a.lora_r is None:
        a.lora_r = 16 if a.model else 0

    warmup_steps = a.warmup * a.epochs
    steps = warmup_steps + a.rollouts * a.epochs
    n_prompts = a.prompts * (a.warmup + a.rollouts)  # one epoch of prompts on both sides
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        hf_dir = build_inputs(ws, n_prompts, a.threads, a)
        weights, low = a.decode_weights, low_precision(a)
        runs = [("llmkit", lambda: printed_run(f"llmkit {low}", run_llmkit(ws, a, steps, warmup_steps, weights,
                                                                         a.base_products))),
                ("trl", lambda: printed_run("trl", run_trl(hf_dir, a, n_prompts, steps, warmup_steps)))]
        if low != "fp32":
            runs.insert(1, ("llmkit_fp32", lambda: printed_run(
                "llmkit fp32", run_llmkit(ws, a, steps, warmup_steps, "fp32"))))
        results, loads = repeat(runs, a.reps)

    batch = a.prompts * a.group
    model = f"{Path(a.model).name} (LoRA r {a.lora_r})" if a.model else "tiny model"
    print(f"GRPO, {model}, reward {a.reward}, {a.prompts} prompts x {a.group} completions = {batch} per generation, "
          f"<= {a.new_tokens} new tokens, {a.epochs} optimizer steps per generation, beta {a.beta}, fp32 "
          f"(llmkit: rollouts through {weights} weights, LoRA base products {a.base_products}), "
          f"{a.threads} CPU threads, {a.reps} repetitions")
    print(f"  llmkit: --set {' '.join(llmkit_settings(a, steps, weights, a.base_products))}")
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renamed settings
    trl = trl_config({"prompts": a.prompts, "group": a.group, "epochs": a.epochs, "new_tokens": a.new_tokens,
                      "beta": a.beta, "steps": steps}, tempfile.gettempdir())
    names = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
             "generation_batch_size", "num_generations", "num_iterations", "max_completion_length",
             "beta", "loss_type", "scale_rewards", "epsilon", "temperature", "learning_rate",
             "lr_scheduler_type", "weight_decay", "max_grad_norm", "bf16", "gradient_checkpointing",
             "max_steps")
    values = {n: getattr(trl, n) for n in names}
    shown = ", ".join(f"{n}={getattr(v, 'value', v)}" for n, v in values.items())  # enums by value
    print(f"  TRL GRPOConfig: {shown}; reference model "
          f"loaded: {results[0]['trl']['reference_model']}")
    print(f"  steps/s of steps {warmup_steps + 1}-{steps} ({a.rollouts} whole generations) over their "
          f"wall-clock time and from their median generation; start-up and the first {a.warmup} "
          f"generation(s) ({warmup_steps} steps) excluded on both sides")
    for i, (r, (before, after)) in enumerate(zip(results, loads), 1):
        ours, peer = r["llmkit"], r["trl"]
        print(f"  rep {i}: load {before:.2f} -> {after:.2f}; steps/s llmkit {ours['rate']:.4f}, "
              f"TRL {peer['rate']:.4f} ({ours['rate'] / peer['rate']:.2f}x); mean completion length "
              f"{ours['completion_length']:.1f} / {peer['completion_length']:.1f} tokens; reward first -> last "
              f"generation {ours['reward'][0]:.3f} -> {ours['reward'][1]:.3f} / "
              f"{peer['reward'][0]:.3f} -> {peer['reward'][1]:.3f}")
    if a.epochs > 1:
        print("  a generation's first step (sampling, reward, old and reference log-probs, update) / an "
              "update-only step, median ms: " + "; ".join(
                  f"rep {i} llmkit {r['llmkit']['generation_step_s'] * 1e3:.0f} / "
                  f"{r['llmkit']['update_step_s'] * 1e3:.0f}, TRL {r['trl']['generation_step_s'] * 1e3:.0f} / "
                  f"{r['trl']['update_step_s'] * 1e3:.0f}" for i, r in enumerate(results, 1)))
    print(f"  {'median [min-max] over the repetitions':<38} {'wall-clock':>22} {'median generation':>22}")
    sides = [(f"llmkit ppo algo=grpo {low}", "llmkit", None), ("TRL GRPOTrainer", "trl", "TRL")]
    sides += [("llmkit ppo algo=grpo fp32", "llmkit_fp32", "llmkit fp32")] if low != "fp32" else []
    for name, key, _ in sides:
        print(f"  {name:<38} {spread([r[key]['rate'] for r in results], RATE):>22} "
              f"{spread([r[key]['median_rate'] for r in results], RATE):>22} steps/s")
    for _, key, peer in sides[1:]:
        ratio = {k: spread([r["llmkit"][k] / r[key][k] for r in results]) for k in ("rate", "median_rate")}
        print(f"  {f'llmkit {low} / {peer}':<38} {ratio['rate']:>22} {ratio['median_rate']:>22} x")
    if low != "fp32":
        print_against_fp32(results, low)
    if a.reward == "code":
        print_sandbox_counts(results, steps)
    if warning := load_warning(loads, a.threads):
        print(warning)


if __name__ == "__main__":
    main()
