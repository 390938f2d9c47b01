"""Retrieval documents for `make -C recipes/long`: the `long` eval task's needle and magic-number
tests (llmkit/eval/long_context.py), written out with their answers as text and as chats, so that a
model learns to look back through its window for what the question names. Writes, under OUT:

- retrieval_short.jsonl: documents of 5/8 x WINDOW..WINDOW tokens, text (the base's pretraining);
- chat_short.jsonl: the same documents as chats, the prompt asked and the answer replied (the SFT
  that teaches the base to retrieve: pretraining alone did not, see the recipe);
- chat_long.jsonl: chats of WINDOW..4 x WINDOW - 16 tokens (the context extension's; the chat
  template's tokens still fit 4 x WINDOW).

Each document is a prompt of the eval task (intro, haystack of the demo corpus's lines, the needles,
the question, the answer's opening words) followed by the answer: what the model will be asked,
in the format it will be asked in, from a seed range the eval never uses (the eval's seed is
`long.seed`, 0 by default; these are 1,000 + the document's number), with the needle at a depth
drawn uniformly. Needle and single_key, en and zh, in equal shares.

`python recipes/long/build_data.py TOKENIZER_DIR OUT [--window 256] [--short 4000] [--long 1200]`
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from llmkit.eval.long_context import Haystack, LongContextConfig, build_sample
from llmkit.tokenizers.sentencepiece import open_tokenizer

TESTS = ("needle", "single_key")  # multi_key's four needles and question fill 157-200 of 256 tokens
ENDINGS = {"en": ".", "zh": "。"}
SEED_BASE = 1000


def documents(tokenizer, count: int, lengths: tuple[int, int], first: int, seed: int):
    """`count` documents of lengths drawn from `lengths` (tokens, inclusive), numbered from `first`."""
    rng = random.Random(seed)
    haystacks = {lang: Haystack(lang, tokenizer) for lang in ("en", "zh")}
    start = len(tokenizer.document_start_ids())
    for n in range(first, first + count):
        test, lang = TESTS[n % len(TESTS)], ("en", "zh")[(n // len(TESTS)) % 2]
        length, depth = rng.randint(*lengths), round(rng.random(), 3)
        cfg = LongContextConfig(tests=[test], langs=[lang], seed=SEED_BASE + n, max_new_tokens=16)
        sample = build_sample(test, lang, length, depth, 0, cfg, haystacks[lang], chat=False)
        prompt = tokenizer.decode(sample.ids[start:])
        space = " " if lang == "en" else ""
        yield {"id": f"{test}-{lang}-{n}", "text": f"{prompt}{space}{sample.references[0]}{ENDINGS[lang]}"}


def chats(docs):
    """The documents as chats: the prompt's text asked, its answer (from the answer's opening words)
    replied, as `eval` asks a chat model (the user turn, then the answer's opening words)."""
    for doc in docs:
        question, answer = doc["text"].rsplit("\n", 1)
        yield {"id": doc["id"], "messages": [{"role": "user", "content": question},
                                             {"role": "assistant", "content": answer}]}


def write(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tokenizer", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--window", type=int, default=256, help="the base model's window (tokens)")
    parser.add_argument("--short", type=int, default=4000, help="documents of the base run")
    parser.add_argument("--long", type=int, default=1200, help="documents of the extension run")
    args = parser.parse_args()
    tokenizer = open_tokenizer(args.tokenizer)
    w = args.window
    short = list(documents(tokenizer, args.short, (w * 5 // 8, w), 0, 0))
    long = list(documents(tokenizer, args.long, (w, 4 * w - 16), args.short, 1))
    write(args.out / "retrieval_short.jsonl", short)
    write(args.out / "chat_short.jsonl", chats(short))
    write(args.out / "chat_long.jsonl", chats(long))
    print(f"{len(short)} documents of {w * 5 // 8}-{w} tokens, {len(long)} of {w}-{4 * w - 16}, under {args.out}")


if __name__ == "__main__":
    main()
