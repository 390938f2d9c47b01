"""Does the quality filter pay? Pretraining on the classifier's top 60% against a random 60%.

The demo's setting: its deduplicated corpus (`dedup` of a demo workspace: Tang/Song poems, Chinese
prose and sayings, Python docstrings) and its tokenizer. The rows that the planted corpus
(tests/data/quality_corpus.py) puts in its test split are the held-out educational slice; the
others form the pool, with generated spam, ads, keyword lists and boilerplate added until they
are 40% of its rows (template phrases the classifier never saw, filler words from the pool).

1. `llmkit quality --good good_train --bad bad_train`: the fastText classifier, trained on the
   planted corpus's train split (no row of the held-out slice), keeps the pool's top 60%.
2. A random selection of the pool with the same token count (seeded).
3. Each selection tokenized with the demo tokenizer and pretrained from scratch, model preset
   `tiny`, the same steps and batch (so the same tokens seen), seeds 0 and 1.
4. `llmkit eval --set tasks=ppl` on the held-out slice: its loss is ln(perplexity per token).

    python bench/quality_pretrain.py --demo-ws workspace --work /tmp/qp [--steps 300]

Prints one line per run and the mean per selection; everything is kept under --work.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # not bench/, whose tokenize.py would shadow the standard library's
LLMKIT = [sys.executable, "-m", "llmkit"]


def llmkit(ws: Path, *args: str) -> None:
    subprocess.run([*LLMKIT, *args, "-w", str(ws)], check=True, stdout=subprocess.DEVNULL)


def settings(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def pool_and_heldout(demo_ws: Path, spam_share: float, seed: int):
    """(pool rows with spam added, held-out educational rows) of the demo's dedup."""
    from llmkit.data.io import read_table
    from tests.data.quality_corpus import Spam, sentences_of, split_of, vocabulary

    rows = read_table(demo_ws / "dedup", columns=["id", "text", "lang"]).to_pylist()
    heldout = [r for r in rows if split_of(r["id"]) == "test"]
    pool = [{**r, "kind": "real"} for r in rows if split_of(r["id"]) == "train"]
    rng = random.Random(seed)
    n_spam = round(len(pool) * spam_share / (1 - spam_share))
    for lang in ("en", "zh"):
        docs = [r["text"] for r in pool if (r["lang"] == "zh") == (lang == "zh")]
        # the test half of the phrase lists: templates the classifier was not trained on
        spam = Spam(lang, "test", vocabulary(docs, lang), sentences_of(docs, lang), rng)
        for i in range(round(n_spam * len(docs) / len(pool))):
            kind, text = spam.document()
            pool.append({"id": f"spam-{lang}-{i:05d}", "text": text, "lang": lang, "kind": kind})
    rng.shuffle(pool)
    return pool, heldout


def token_counts(texts: list[str], tokenizer_dir: Path) -> list[int]:
    from llmkit.tokenizers.sentencepiece import Tokenizer

    return [len(ids) + 1 for ids in Tokenizer(tokenizer_dir).encode_batch(texts)]


def random_selection(pool: list[dict], tokens: dict, target: int, seed: int) -> list[dict]:
    """Pool rows in a seeded random order until they hold `target` tokens."""
    order = list(pool)
    random.Random(seed).shuffle(order)
    out, total = [], 0
    for r in order:
        if total >= target:
            break
        out.append(r)
        total += tokens[r["id"]]
    return out


def train_and_eval(ws: Path, selection: str, seed: int, steps: int, heldout: Path) -> float:
    run = f"pt_{selection}_s{seed}"
    llmkit(ws, "pretrain", "--in", f"tokens_{selection}", "--out", run, *settings(
        "model.preset=tiny", "seq_len=128", "micro_batch_size=8", f"max_steps={steps}",
        "lr=1e-3", "min_lr=1e-4", "warmup_steps=20", "eval_every=0", "save_every=0",
        "log_every=50", f"seed={seed}"))
    llmkit(ws, "eval", "--from", run, "--out", f"eval_{run}", *settings(
        "tasks=ppl", "tokens=null", f"ppl.datasets={heldout}", "ppl.max_docs=5000"))
    results = json.loads((ws / "eval" / f"eval_{run}" / "results.json").read_text())
    return math.log(next(iter(results["ppl"].values()))["ppl"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--demo-ws", type=Path, help="a demo workspace (read only)")
    p.add_argument("--work", type=Path, default=Path("/tmp/llmkit-quality-pretrain"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--spam-share", type=float, default=0.4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = p.parse_args()
    if not args.demo_ws:
        return print("skip: needs --demo-ws, a demo workspace (make demo)")
    from tests.data.quality_corpus import build, write

    ws = args.work / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    if not (ws / "tokenizer").exists():
        shutil.copytree(args.demo_ws / "tokenizer", ws / "tokenizer")
    write(args.work / "corpus", build())
    pool, heldout = pool_and_heldout(args.demo_ws, args.spam_share, seed=0)
    held_file = write_jsonl(args.work / "heldout.jsonl", heldout)
    write_jsonl(args.work / "pool.jsonl", pool)
    llmkit(ws, "ingest", str(args.work / "pool.jsonl"), "--out", "pool")
    llmkit(ws, "quality", "--in", "pool", "--good", str(args.work / "corpus/good_train.jsonl"),
           "--bad", str(args.work / "corpus/bad_train.jsonl"), "--out", "top",
           *settings("keep_top=0.6"))
    from llmkit.data.io import read_table

    tokens = dict(zip([r["id"] for r in pool],
                      token_counts([r["text"] for r in pool], ws / "tokenizer")))
    top = read_table(ws / "top", columns=["id", "kind"]).to_pylist()
    target = sum(tokens[r["id"]] for r in top)
    rand = random_selection(pool, tokens, target, seed=0)
    write_jsonl(args.work / "rand.jsonl", rand)
    llmkit(ws, "ingest", str(args.work / "rand.jsonl"), "--out", "rand")
    for name, rows in (("top", top), ("rand", rand)):
        spam = sum(r["kind"] != "real" for r in rows)
        print(f"{name}: {len(rows)} rows, {sum(tokens[r['id']] for r in rows):,} tokens, "
              f"{spam / len(rows):.1%} spam", flush=True)
        llmkit(ws, "tokenize", "--in", name, "--out", f"tokens_{name}",
               *settings("val_fraction=0.01"))
    print(f"pool: {len(pool)} rows ({sum(r['kind'] != 'real' for r in pool)} spam); held-out "
          f"slice: {len(heldout)} rows; load {os.getloadavg()[0]:.2f}", flush=True)
    losses: dict[str, list[float]] = {"top": [], "rand": []}
    for seed in args.seeds:
        for name in ("top", "rand"):
            t0 = time.time()
            losses[name].append(train_and_eval(ws, name, seed, args.steps, held_file))
            print(f"{name} seed {seed}: held-out loss {losses[name][-1]:.4f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    for name, values in losses.items():
        print(f"{name}: mean held-out loss {sum(values) / len(values):.4f} over seeds "
              f"{args.seeds}: {', '.join(f'{v:.4f}' for v in values)}")


if __name__ == "__main__":
    main()
