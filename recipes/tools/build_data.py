"""The calculator task of `make -C recipes/tools`: multiply a 2-3-digit number by a 2-digit one,
asked in English or Chinese. Writes, under OUT:

- sft_tool.jsonl: demonstrations of calling the calculator (llmkit's tool markup: the reply is a
  <tool_call>, the result comes back as a user turn of <tool_response>, the answer follows), a
  share of them (--direct-share) answered at once instead, as sft_direct's are: the SFT model then
  calls the tool on some samples and guesses on the others, and GRPO has that choice to learn;
- sft_direct.jsonl: the same questions answered at once (the baseline without the tool);
- prompts_train.jsonl, prompts_eval.jsonl: prompts with their answers, for GRPO and the held-out
  score (disjoint question pairs).

`python recipes/tools/build_data.py OUT [--demos 1000] [--direct-share 0.5] [--train 400] [--eval 100]
[--seed 0]`
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

QUESTIONS = ["What is {a}*{b}?", "Compute {a} × {b}.", "Multiply {a} by {b}.", "计算 {a}×{b}",
             "{a} 乘以 {b} 等于多少？"]


def tool_call(a: int, b: int) -> str:
    return '<tool_call>{"name": "calculator", "arguments": {"expression": "%d*%d"}}</tool_call>' % (a, b)


def tool_demo(a: int, b: int, question: str) -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": tool_call(a, b)},
            {"role": "user", "content": f"<tool_response>\n{a * b}\n</tool_response>"},
            {"role": "assistant", "content": str(a * b)}]


def direct_answer(a: int, b: int, question: str) -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": str(a * b)}]


def pairs(rng: random.Random, n: int, taken: set) -> list[tuple[int, int, str]]:
    out = []
    while len(out) < n:
        a, b = rng.randint(10, 999), rng.randint(10, 99)
        if (a, b) in taken:
            continue
        taken.add((a, b))
        out.append((a, b, rng.choice(QUESTIONS).format(a=a, b=b)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--demos", type=int, default=1000)  # 200 were learnt by heart: see recipe.yaml
    parser.add_argument("--direct-share", type=float, default=0.5)
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--eval", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng, taken = random.Random(args.seed), set()
    held_out = pairs(rng, args.eval, taken)  # drawn first: no demo or training prompt repeats one
    demos, train = pairs(rng, args.demos, taken), pairs(rng, args.train, taken)
    # its own generator: the questions stay those of the same seed whatever the share
    direct = set(random.Random(args.seed + 1).sample(range(len(demos)),
                                                      round(args.direct_share * len(demos))))
    args.out.mkdir(parents=True, exist_ok=True)

    def write(name, rows):
        with open(args.out / name, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)

    write("sft_tool.jsonl", [{"id": f"demo-{i}", "messages": direct_answer(a, b, q) if i in direct
                              else tool_demo(a, b, q)} for i, (a, b, q) in enumerate(demos)])
    write("sft_direct.jsonl", [{"id": f"demo-{i}", "messages": direct_answer(a, b, q)}
                               for i, (a, b, q) in enumerate(demos)])
    write("prompts_train.jsonl", [{"id": f"train-{i}", "prompt": q, "answer": str(a * b)}
                                  for i, (a, b, q) in enumerate(train)])
    write("prompts_eval.jsonl", [{"id": f"eval-{i}", "prompt": q, "answer": str(a * b)}
                                 for i, (a, b, q) in enumerate(held_out)])


if __name__ == "__main__":
    main()
