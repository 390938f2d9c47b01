"""Build the demo's verifiable post-training tasks in recipes/demo/data/tasks/.

Two tasks, each with one exactly checkable answer: reversing a short made-up word spelled out letter by
letter ("Reverse: a b c" -> "c b a"), which the demo's ~5M-parameter model starts to learn on a CPU in
minutes, and two-digit addition ("What is 23+45?" -> "68"), which it does not learn in that budget (one
prompt in five: the reward model and the evaluation still meet arithmetic). Both are asked in English and
in Chinese ("反转：a b c", "计算 23+45").
Letters are spaced so that each is one token: BPE merges letter pairs of an unspaced word into pieces
("nniz" -> "n n iz"), and reversing pieces is a different, much harder task. Every record carries
`answer`, `task` and `lang`, so a reward is exact match of the stripped response against `answer`.

Train and eval are disjoint problems, not only disjoint prompts: an addition is held out with its operands in
either order, a word together with its reversal, so no eval answer was ever seen as a training response.

    python recipes/demo/build_tasks.py            # rewrites recipes/demo/data/tasks/*.jsonl
"""

from __future__ import annotations

import argparse
import json
import string
from dataclasses import dataclass
from pathlib import Path
from random import Random

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "tasks"
DEFAULT_SEED = 20240229
TEMPLATES = {
    ("addition", "en"): ["What is {a}+{b}?", "{a}+{b}="],
    ("addition", "zh"): ["计算 {a}+{b}"],
    ("reversal", "en"): ["Reverse: {word}"],
    ("reversal", "zh"): ["反转：{word}"],
}
# four reversals to one addition: a 5M-parameter model learns reversal within the demo's few
# hundred steps, but not two-digit addition, and an even mix slows the reversal down as well
TASK_CYCLE = ("reversal", "reversal", "addition", "reversal", "reversal")
WORD_LENGTHS = (3, 4)  # short words keep answers to a few tokens
EVAL_ADDITIONS = 100  # unordered operand pairs held out
EVAL_WORDS = 100  # words held out (with their reversals)
SIZES = {  # file -> rows
    "sft_train": 4000,
    "sft_eval": 200,
    "pref_train": 2000,
    "pref_eval": 200,
    "prompts_train": 1000,
    "prompts_eval": 200,
}
MESSAGES_FRACTION = 0.2  # of sft_train, written in chat `messages` form
RANKED_FRACTION = 0.05  # of pref_train, written as a ranked `responses` list instead of one pair


@dataclass(frozen=True)
class Problem:
    task: str  # "addition" or "reversal"
    a: int = 0
    b: int = 0
    word: str = ""

    @property
    def answer(self) -> str:
        return str(self.a + self.b) if self.task == "addition" else spell(self.word[::-1])

    def prompt(self, template: str) -> str:
        return template.format(a=self.a, b=self.b, word=spell(self.word))


def spell(word: str) -> str:
    return " ".join(word)


def addition_split(rng: Random) -> tuple[list[Problem], list[Problem]]:
    pairs = [(a, b) for a in range(10, 100) for b in range(a, 100)]
    held = set(rng.sample(pairs, EVAL_ADDITIONS))
    train, evaluation = [], []
    for a in range(10, 100):
        for b in range(10, 100):
            (evaluation if (min(a, b), max(a, b)) in held else train).append(Problem("addition", a, b))
    return train, evaluation


def random_word(rng: Random) -> str:
    while True:
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.choice(WORD_LENGTHS)))
        if word != word[::-1]:  # a palindrome's reversal is itself: the "unreversed" wrong answer would be right
            return word


def reversal_split(rng: Random, train_size: int) -> tuple[list[Problem], list[Problem]]:
    held: list[str] = []
    while len(held) < EVAL_WORDS:
        word = random_word(rng)
        if word not in held and word[::-1] not in held:
            held.append(word)
    blocked = set(held) | {w[::-1] for w in held}
    train: list[str] = []
    seen: set[str] = set()
    while len(train) < train_size:
        word = random_word(rng)
        if word not in blocked and word not in seen:
            seen.add(word)
            train.append(word)
    return [Problem("reversal", word=w) for w in train], [Problem("reversal", word=w) for w in held]


def sample_prompts(problems: dict[str, list[Problem]], n: int, rng: Random) -> list[tuple[Problem, str, str]]:
    """n distinct (problem, language, prompt) triples, tasks in TASK_CYCLE's proportions, languages and
    templates mixed."""
    chosen, seen = [], set()
    while len(chosen) < n:
        task = TASK_CYCLE[len(chosen) % len(TASK_CYCLE)]
        problem = rng.choice(problems[task])
        lang = rng.choice(("en", "zh"))
        prompt = problem.prompt(rng.choice(TEMPLATES[(task, lang)]))
        if prompt not in seen:
            seen.add(prompt)
            chosen.append((problem, lang, prompt))
    return chosen


def near_miss(problem: Problem, rng: Random) -> str:
    """A wrong answer one small slip away: the last digit off by one or two, or two neighbouring
    letters swapped."""
    if problem.task == "addition":
        return str(problem.a + problem.b + rng.choice((-2, -1, 1, 2)))
    letters = list(problem.word[::-1])
    while "".join(letters) == problem.word[::-1]:
        i = rng.randrange(len(letters) - 1)
        letters[i], letters[i + 1] = letters[i + 1], letters[i]
    return spell("".join(letters))


def far_miss(problem: Problem, rng: Random) -> str:
    """A wrong answer that ignores the question: a random sum, or the word not reversed."""
    if problem.task == "reversal":
        return spell(problem.word)
    while True:
        guess = str(rng.randint(20, 198))
        if guess != problem.answer:
            return guess


def wrong_answer(problem: Problem, rng: Random) -> str:
    return near_miss(problem, rng) if rng.random() < 0.6 else far_miss(problem, rng)


def labels(problem: Problem, lang: str) -> dict:
    return {"answer": problem.answer, "task": problem.task, "lang": lang}


def sft_records(items, rng: Random, messages_fraction: float) -> list[dict]:
    records = []
    for problem, lang, prompt in items:
        if rng.random() < messages_fraction:
            chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": problem.answer}]
            records.append({"messages": chat, **labels(problem, lang)})
        else:
            records.append({"prompt": prompt, "response": problem.answer, **labels(problem, lang)})
    return records


def preference_records(items, rng: Random, ranked_fraction: float) -> list[dict]:
    records = []
    for problem, lang, prompt in items:
        if rng.random() < ranked_fraction:
            ranked = [problem.answer, near_miss(problem, rng), far_miss(problem, rng)]
            if len(set(ranked)) == 3:
                records.append({"prompt": prompt, "responses": ranked, **labels(problem, lang)})
                continue
        rejected = wrong_answer(problem, rng)
        records.append({"prompt": prompt, "chosen": problem.answer, "rejected": rejected, **labels(problem, lang)})
    return records


def prompt_records(items) -> list[dict]:
    return [{"prompt": prompt, **labels(problem, lang)} for problem, lang, prompt in items]


def build(seed: int) -> dict[str, list[dict]]:
    rng = Random(seed)
    add_train, add_eval = addition_split(rng)
    rev_train, rev_eval = reversal_split(rng, train_size=len(add_train))
    train = {"addition": add_train, "reversal": rev_train}
    evaluation = {"addition": add_eval, "reversal": rev_eval}

    def items(name: str):
        return sample_prompts(evaluation if name.endswith("_eval") else train, SIZES[name], rng)

    return {
        "sft_train": sft_records(items("sft_train"), rng, MESSAGES_FRACTION),
        "sft_eval": sft_records(items("sft_eval"), rng, 0.0),
        "pref_train": preference_records(items("pref_train"), rng, RANKED_FRACTION),
        "pref_eval": preference_records(items("pref_eval"), rng, 0.0),
        "prompts_train": prompt_records(items("prompts_train")),
        "prompts_eval": prompt_records(items("prompts_eval")),
    }


def write(files: dict[str, list[dict]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, records in files.items():
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        (out / f"{name}.jsonl").write_text(lines, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed for every random choice")
    args = parser.parse_args()
    files = build(args.seed)
    write(files, args.out)
    for name, records in files.items():
        print(f"{name}.jsonl: {len(records)} rows")


if __name__ == "__main__":
    main()
