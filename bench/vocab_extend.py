"""Vocabulary extension, measured: per-byte loss before any training (original model, extended with
`mean` rows, extended with LLaMA-Factory's `noisy_mean` rows) on held-out English and Chinese, and
continued pretraining of the original and the extended model on the same Chinese bytes (the
same steps x bytes per step: the extended run's sequences are shorter by its tokens-per-byte ratio).

    python bench/vocab_extend.py init ORIGINAL_RUN EXTENDED_RUN CORPUS_DATASET [--docs 24 --chars 400]
    python bench/vocab_extend.py pretrain WORKSPACE ORIGINAL EXTENDED ZH_TRAIN ZH_HELDOUT [--steps 12 --seeds 0,1]

Held-out documents are those `llmkit extend-vocab` held out (heldout_fraction, seed); each is cut to
its first --chars characters so both tokenizers score the same bytes. Per-byte loss = the summed
next-token NLL of the text tokens (after the document start) / its UTF-8 bytes, in nats."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# bench/tokenize.py would shadow the standard library's tokenize
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]


def heldout_docs(corpus: Path, fraction: float, seed: int, docs: int, chars: int) -> dict[str, list[str]]:
    import pyarrow.parquet as pq

    from llmkit.data.tokenizer_training import _hash01

    by_lang: dict[str, list[str]] = {"en": [], "zh": []}
    for f in sorted(corpus.glob("part-*.parquet")):
        t = pq.read_table(f, columns=["id", "text", "lang"]).to_pydict()
        for i, text, lang in zip(t["id"], t["text"], t["lang"]):
            if lang in by_lang and _hash01("heldout", seed, i) < fraction and len(by_lang[lang]) < docs:
                by_lang[lang].append(text[:chars])
    return by_lang


def per_byte_loss(model, tokenizer, texts: list[str]) -> float:
    import torch

    nll, n_bytes = 0.0, 0
    with torch.no_grad():
        for text in texts:
            start = tokenizer.document_start_ids()
            ids = torch.tensor([start + tokenizer.encode(text)])
            logits = model(ids)[0, :-1].float()
            targets = ids[0, 1:]
            losses = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
            nll += float(losses[len(start) - 1:].sum())
            n_bytes += len(text.encode("utf-8"))
    return nll / n_bytes


def noisy_mean_model(extended, original_vocab: int, seed: int = 0):
    """The extended model with its new rows re-initialised as LLaMA-Factory's noisy mean."""
    import torch

    from llmkit.hf.vocab_extend import grown_rows

    weight = extended.model.embed_tokens.weight
    rows = weight.shape[0]
    ids = list(range(original_vocab, rows))
    with torch.no_grad():
        weight.copy_(grown_rows(weight[:original_vocab], ids, [], rows, original_vocab, "noisy_mean",
                                torch.Generator().manual_seed(seed)))
        if extended.lm_head.weight is not weight:
            head = extended.lm_head.weight
            head.copy_(grown_rows(head[:original_vocab], ids, [], rows, original_vocab, "noisy_mean",
                                  torch.Generator().manual_seed(seed + 1)))
    return extended


def init_losses(args) -> dict:
    import llmkit

    stats = json.loads((Path(args.extended) / "manifest.json").read_text())
    cfg = stats["config"]
    texts = heldout_docs(Path(args.corpus), cfg["heldout_fraction"], cfg["seed"], args.docs, args.chars)
    original, old_tok = llmkit.load(args.original)
    extended, new_tok = llmkit.load(args.extended)
    out = {}
    for lang, docs in texts.items():
        out[lang] = {"docs": len(docs), "original": per_byte_loss(original, old_tok, docs),
                     "mean": per_byte_loss(extended, new_tok, docs)}
    noisy = noisy_mean_model(extended, old_tok.vocab_size)
    for lang, docs in texts.items():
        out[lang]["noisy_mean"] = per_byte_loss(noisy, new_tok, docs)
        out[lang].update({f"{k}_vs_original_pct": round(100 * (out[lang][k] / out[lang]["original"] - 1), 2)
                          for k in ("mean", "noisy_mean")})
    return out


def llmkit(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "llmkit", *args], check=True, stdout=subprocess.DEVNULL)


def pretrain_pair(args) -> dict:
    """Continued pretraining of ORIGINAL and EXTENDED on the same bytes: tokenize ZH_TRAIN with each
    tokenizer, pick sequence lengths with equal bytes, train --steps per seed, score ZH_HELDOUT."""
    ws = Path(args.workspace)
    out = {}
    for name in (args.original, args.extended):
        llmkit("tokenize", "--in", args.zh_train, "--tokenizer", name, "--out", f"tokens-{name}", "-w", str(ws),
               "--set", "val_fraction=0")
    tokens = {n: json.loads((ws / f"tokens-{n}/manifest.json").read_text())["stats"]
              for n in (args.original, args.extended)}
    count = {n: sum(s.get("tokens_per_source", {}).values()) or s.get("tokens") for n, s in tokens.items()}
    ratio = count[args.extended] / count[args.original]
    seq = {args.original: args.seq_len, args.extended: max(8, round(args.seq_len * ratio))}
    for seed in args.seeds:
        for name in (args.original, args.extended):
            run = f"cpt-{name}-s{seed}"
            started = time.time()
            llmkit("pretrain", "--from", name, "--in", f"tokens-{name}", "--out", run, "-w", str(ws),
                   "--set", f"max_steps={args.steps}", "--set", "warmup_steps=0", "--set", f"seq_len={seq[name]}",
                   "--set", f"micro_batch_size={args.batch}", "--set", "eval_every=0", "--set", f"seed={seed}",
                   "--set", "lr=1e-4")
            seconds = time.time() - started
            llmkit("eval", "--from", run, "--out", f"bpb-{run}", "-w", str(ws), "--set", "tokens=null",
                   "--set", f"ppl.datasets={args.zh_heldout}")
            report = json.loads(next((ws / "eval" / f"bpb-{run}").glob("*.json")).read_text()) \
                if list((ws / "eval" / f"bpb-{run}").glob("*.json")) else {}
            out[run] = {"seq_len": seq[name], "seconds": round(seconds, 1), "eval": report}
    out["tokens_ratio"] = ratio
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what")
    init = sub.add_parser("init")
    init.add_argument("original"), init.add_argument("extended"), init.add_argument("corpus")
    init.add_argument("--docs", type=int, default=24)
    init.add_argument("--chars", type=int, default=400)
    pre = sub.add_parser("pretrain")
    for a in ("workspace", "original", "extended", "zh_train", "zh_heldout"):
        pre.add_argument(a)
    pre.add_argument("--steps", type=int, default=12)
    pre.add_argument("--seq-len", type=int, default=256)
    pre.add_argument("--batch", type=int, default=2)
    pre.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1])
    args = parser.parse_args()
    if not args.what:
        return print("skip: needs `init` or `pretrain` and their models and corpora (see the module's docstring)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = init_losses(args) if args.what == "init" else pretrain_pair(args)
    print(json.dumps(result, indent=2))
    print(f"load: {os.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
