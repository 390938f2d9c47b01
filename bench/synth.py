"""`llmkit synth` measured on a real model (SmolLM2-135M-Instruct as `llmkit import` wrote it).

speed: `synth --kind answers`' generator (llmkit.synth.engine.LocalGenerator.complete, the code
  a synth task runs) against transformers' `generate` over the same chat prompts and settings
  (sampling at temperature 0.7, top_p 1, no top-k, the same max_new_tokens and batch size, prompts
  batched shortest first on both sides), in one process, alternating A B A B A B. Tokens are
  each reply's up to and including its end of turn; tokens/s = tokens / wall seconds.
grounding: qa's grounding check on 50 planted documents, each once with its stated fact as the
  answer (supported) and once with another document's fact (unsupported): the share kept and the
  share rejected, asking the model (grounding=ask: P(yes) at min_support) and by the document's
  lift of the answer's likelihood (grounding=likelihood, at min_gain).
magpie: what finished `synth --kind instructions` runs (their output folders) hold: samples, kept
  (one user turn), removed by reason, exact duplicates among the kept; of the unclosed samples,
  whether they repeat themselves (the most repeated word 3-gram, zlib's compression ratio beside
  the long kept ones'); with --model, the share of each sample's tokens that lay outside the top_p
  nucleus where it was sampled (teacher-forced at temperature 1): drift into the tail, or not.

    python bench/synth.py speed --model /tmp/smolws/smollm2 --hf WS/smol_hf --prompts 48 [--threads 1]
    python bench/synth.py grounding --model /tmp/smolws/smollm2
    python bench/synth.py magpie WS/run1 WS/run2 [--model /tmp/smolws/smollm2 --top-p 0.9]
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)  # the repository root, not bench/, on the path

import argparse
import collections
import json
import os
import random
import statistics
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from llmkit.checkpoints.loading import load  # noqa: E402
from llmkit.synth import kinds  # noqa: E402
from llmkit.synth.config import SynthConfig  # noqa: E402
from llmkit.data.io import read_table  # noqa: E402
from llmkit.synth.engine import LocalGenerator, user_turn_prefix  # noqa: E402
from llmkit.synth.prompts import GROUNDING  # noqa: E402
from llmkit.synth.requests import Sampling  # noqa: E402

PROMPTS = REPO / "recipes/demo/data/tasks/prompts_eval.jsonl"


def chats(n: int) -> list[list[dict]]:
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()[:n]]
    return [[{"role": "user", "content": r["prompt"]}] for r in rows]


def load_avg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def run_llmkit(gen: LocalGenerator, prompts, sampling: Sampling, seed: int) -> tuple[float, int]:
    before, start = gen.tokens, time.perf_counter()
    gen.complete(prompts, sampling, seed)
    return time.perf_counter() - start, gen.tokens - before


def run_transformers(model, tok, prompts, sampling: Sampling, batch_size: int, seed: int) -> tuple[float, int]:
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    texts = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    texts.sort(key=lambda t: len(tok(t, add_special_tokens=False).input_ids))  # shortest first, as llmkit
    torch.manual_seed(seed)
    start, tokens = time.perf_counter(), 0
    for at in range(0, len(texts), batch_size):
        enc = tok(texts[at:at + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                                 top_k=0, max_new_tokens=sampling.max_new_tokens, eos_token_id=eot,
                                 pad_token_id=tok.pad_token_id or eot)
        for row in out[:, enc.input_ids.shape[1]:].tolist():
            tokens += row.index(eot) + 1 if eot in row else len(row)
    return time.perf_counter() - start, tokens


def speed(args) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)  # one thread holds up on a shared machine (bench/results/README.md)
    prompts = chats(args.prompts)
    sampling = Sampling(0.7, 1.0, None, args.max_new_tokens)
    gen = LocalGenerator(*load(args.model), batch_size=args.batch_size)
    tok = AutoTokenizer.from_pretrained(args.hf)
    tok.padding_side = "left"
    hf = AutoModelForCausalLM.from_pretrained(args.hf, torch_dtype=torch.float32).eval()
    print(f"threads {torch.get_num_threads()}, {len(prompts)} prompts, max_new_tokens {args.max_new_tokens}, "
          f"batch {args.batch_size}, temperature 0.7")
    runs = {"llmkit": [], "transformers": []}
    run_llmkit(gen, prompts[:4], sampling, 0)  # warm both sides (kernels, allocator)
    run_transformers(hf, tok, prompts[:4], sampling, args.batch_size, 0)
    for k in range(args.runs):
        for side in ("llmkit", "transformers"):
            load_before = load_avg()
            seconds, tokens = (run_llmkit(gen, prompts, sampling, k) if side == "llmkit" else
                               run_transformers(hf, tok, prompts, sampling, args.batch_size, k))
            runs[side].append(tokens / seconds)
            print(f"run {k + 1} {side:12s} {tokens:6d} tokens {seconds:7.1f} s {tokens / seconds:7.1f} tokens/s "
                  f"(load {load_before})", flush=True)
    med = {side: statistics.median(v) for side, v in runs.items()}
    for side, v in runs.items():
        print(f"{side:12s} median {med[side]:.1f} tokens/s, min-max {min(v):.1f}-{max(v):.1f}")
    print(f"ratio of medians llmkit / transformers: {med['llmkit'] / med['transformers']:.2f}x")


def planted(n: int = 50, seed: int = 0) -> list[tuple[str, str, str, str]]:
    """(document, question, supported answer, unsupported answer) × n."""
    rng = random.Random(seed)
    names = [f"{rng.choice(['Zor', 'Kel', 'Ost', 'Var', 'Quil'])}{rng.choice(['vania', 'bria', 'mark', 'holt', 'land'])}"
             for _ in range(n)]
    capitals = ["".join(rng.choice("bcdfgklmnprstv") + rng.choice("aeiou") for _ in range(3)).title()
                for _ in range(n)]
    out = []
    for i in range(n):
        doc = (f"{names[i]} is a small country in the north. Its capital is {capitals[i]}, a port city of "
               f"about {rng.randint(2, 90) * 10000} people, known for its fish market.")
        out.append((doc, f"What is the capital of {names[i]}?", capitals[i], capitals[(i + 7) % n]))
    return out


def grounding(args) -> None:
    gen = LocalGenerator(*load(args.model), batch_size=args.batch_size)
    docs = planted(seed=args.seed)
    print(f"planted documents of seed {args.seed}")
    if not args.skip_ask:
        ask_judge(gen, docs, args)
    likelihood_judge(gen, docs, args)


def ask_judge(gen, docs, args) -> None:
    ask = [[{"role": "user", "content": GROUNDING["en"].format(document=d, question=q, answer=a)}]
           for d, q, good, bad in docs for a in (good, bad)]
    start = time.perf_counter()
    p = gen.yes_probability(ask)
    supported, unsupported = p[0::2], p[1::2]
    kept = sum(x >= args.min_support for x in supported) / len(supported)
    rejected = sum(x < args.min_support for x in unsupported) / len(unsupported)
    ranked = sum(s > u for s, u in zip(supported, unsupported)) / len(docs)
    print(f"grounding=ask: {len(docs)} documents, min_support {args.min_support}, "
          f"{time.perf_counter() - start:.1f} s (load {load_avg()})")
    print(f"supported kept {kept:.0%}, unsupported rejected {rejected:.0%}; mean P(yes) supported "
          f"{statistics.mean(supported):.3f}, unsupported {statistics.mean(unsupported):.3f}; "
          f"supported above its unsupported twin {ranked:.0%}")


def likelihood_judge(gen, docs, args) -> None:
    start = time.perf_counter()
    found = [(None, d, "en", None, q, a) for d, q, good, bad in docs for a in (good, bad)]
    gain = kinds.grounding(found, gen, SynthConfig(kind="qa", grounding="likelihood"))
    supported, unsupported = gain[0::2], gain[1::2]
    kept = sum(x >= args.min_gain for x in supported) / len(supported)
    rejected = sum(x < args.min_gain for x in unsupported) / len(unsupported)
    print(f"grounding=likelihood: min_gain {args.min_gain} nats/token, {time.perf_counter() - start:.1f} s "
          f"(load {load_avg()})")
    print(f"supported kept {kept:.0%}, unsupported rejected {rejected:.0%}; mean gain supported "
          f"{statistics.mean(supported):.2f}, unsupported {statistics.mean(unsupported):.2f} nats/token")
    for least in (0.5, 1.0, 1.5, 2.0, 3.0):
        print(f"  min_gain {least}: supported kept {sum(x >= least for x in supported) / len(supported):.0%}, "
              f"unsupported rejected {sum(x < least for x in unsupported) / len(unsupported):.0%}")


def magpie(args) -> None:
    scorer = None
    if args.model:
        model, tok = load(args.model)
        scorer = (model.eval(), tok, list(user_turn_prefix(tok)[0]))
    for folder in map(Path, args.runs):
        stats = json.loads((folder / "manifest.json").read_text())["stats"]
        kept = [r["prompt"] for r in read_table(folder).to_pylist()]
        removed = read_table(folder / "removed").to_pylist() if (folder / "removed").exists() else []
        unclosed = [r["text"] for r in removed if r["reason"] == "no_end_of_turn"]
        dups = len(kept) - len({" ".join(k.lower().split()) for k in kept})
        print(f"{folder.name}: sampling {stats['synth']['sampling']}, seed {stats['synth']['seed']}: "
              f"{stats['rows_in']} samples, {stats['rows_out']} one user turn "
              f"({stats['rows_out'] / stats['rows_in']:.1%}), removed {stats['removed_by_reason']}, "
              f"exact duplicates among the kept {dups}, {stats['tokens_generated']} tokens in "
              f"{stats['generate_seconds']} s")
        if unclosed:
            print(f"  unclosed: most repeated word 3-gram {sorted(map(top_trigram, unclosed))}; zlib ratio "
                  f"{stats_of([packed(t) for t in unclosed])} (long kept ones: "
                  f"{stats_of([packed(k) for k in kept if len(k) > 300])})")
        if scorer:
            for name, texts in (("kept", kept), ("unclosed", unclosed)):
                shares = [outside_nucleus(*scorer, t, args.top_p) for t in texts]
                print(f"  {name}: tokens outside the top_p {args.top_p} nucleus, per sample "
                      f"{stats_of(shares)}; samples with any {sum(x > 0 for x in shares)}/{len(shares)}")


def top_trigram(text: str) -> int:
    words = text.split()
    return max(collections.Counter(zip(words, words[1:], words[2:])).values(), default=0)


def packed(text: str) -> float:
    return len(zlib.compress(text.encode())) / max(len(text.encode()), 1)


def stats_of(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.3f}, {min(xs):.3f}-{max(xs):.3f}" if xs else "none"


@torch.no_grad()
def outside_nucleus(model, tok, prefix: list[int], text: str, top_p: float) -> float:
    """The share of the text's tokens that nucleus sampling at top_p (temperature 1) could not
    have drawn after the prefix and the tokens before them (the text re-encoded)."""
    ids = tok.encode(text)
    if not ids:
        return 0.0
    logits = model(torch.tensor([prefix + ids]))[0, len(prefix) - 1:-1].float()
    probs = logits.softmax(-1)
    sorted_p, _ = probs.sort(-1, descending=True)
    mine = probs.gather(-1, torch.tensor(ids)[:, None])
    # a token is in the nucleus when the tokens likelier than it hold less than top_p
    above = (sorted_p * (sorted_p > mine)).sum(-1, keepdim=True)
    return float((above >= top_p).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--model", required=True)
    s.add_argument("--hf", required=True, help="the same model as a transformers folder (llmkit export)")
    s.add_argument("--prompts", type=int, default=64)
    s.add_argument("--max-new-tokens", type=int, default=64)
    s.add_argument("--batch-size", type=int, default=16)
    s.add_argument("--runs", type=int, default=3)
    s.add_argument("--threads", type=int, default=1)
    g = sub.add_parser("grounding")
    g.add_argument("--model", required=True)
    g.add_argument("--batch-size", type=int, default=16)
    g.add_argument("--min-support", type=float, default=0.5)
    g.add_argument("--min-gain", type=float, default=2.0)
    g.add_argument("--skip-ask", action="store_true", help="only grounding=likelihood")
    g.add_argument("--seed", type=int, default=0, help="another seed: other names, facts and sizes")
    m = sub.add_parser("magpie")
    m.add_argument("runs", nargs="+", help="output folders of synth --kind instructions")
    m.add_argument("--model", help="the model that sampled them: measure the tokens outside the nucleus")
    m.add_argument("--top-p", type=float, default=0.9)
    args = parser.parse_args()
    {"speed": speed, "grounding": grounding, "magpie": magpie}[args.what](args)


if __name__ == "__main__":
    main()
