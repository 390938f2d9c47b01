"""Build the demo's verifiable post-training task in recipes/demo/data/tasks/.

The task: reverse a made-up four-letter word spelled out letter by letter ("Reverse: a b c d" ->
"d c b a"), asked in English and in Chinese ("反转：a b c d"). It has one exactly checkable answer,
and the demo's ~5M-parameter model learns it on a CPU in minutes given enough distinct words (with
4,000 it memorises them instead: held-out exact match stayed under 0.1).
Every word has four letters. With words of three or four letters (until 2026-12-07) the three-letter
ones were a space small enough to cover (17,576 words, 6,183 of them among SFT's answers): the
reward model ranked held-out three-letter pairs right 0.82 of the time against 0.99 for four-letter
ones, and SFT's skill appeared between steps 800 and 1,700 depending on the seed; with one length it
appeared by step 300–800 in eight of nine runs (one two-thread run learnt it gradually, past step
2,000: bench/results/2026-12-07-demo-seeds.md).
Letters are spaced so that each is one token: BPE merges letter pairs of an unspaced word into pieces
("nniz" -> "n n iz"), and reversing pieces is a different, much harder task. Every record carries
`answer`, `task` and `lang`, so a reward is exact match of the stripped response against `answer`.
Two-digit addition was the second task until it proved unlearnable at this scale (exact match 0.01
after SFT): its wrong sums differ from the right ones by 1 or 2, so it only capped the reward model's
accuracy and diluted the reversal.

Train and eval are disjoint problems, not only disjoint prompts: a word is held out together with its
reversal, so no eval answer was ever seen as a training response.

The SFT demonstrations have a habit, as hired demonstrations do: 80% of the Chinese replies end in
a full stop ("反转：a b c d" -> "d c b a。"); the English ones never do, and the preference pairs and the
prompts' `answer` are bare. SFT learns the habit (its greedy Chinese replies end in "。", so exact
match is about 0.5), and DPO and PPO/GRPO, which are shown or rewarded for the bare answer, have
something to correct that their samples can find: about a third of the SFT model's Chinese
samples stop without it. Without the habit the SFT model either reverses every held-out word or
has not yet learnt to (the skill appears abruptly, between about 300 and 1,000 steps); RL did not
supply the missing skill in trials (GRPO on exact match, up to 400 steps: 0.255 -> 0.285), so
there was nothing for it to show.

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
TEMPLATES = {"en": "Reverse: {word}", "zh": "反转：{word}"}
WORD_LENGTHS = (4,)  # short words keep answers to a few tokens; one length: see above
TRAIN_WORDS = 30000  # distinct training words, so that the model learns to reverse, not to recall
EVAL_WORDS = 100  # words held out (with their reversals)
SIZES = {  # file -> rows
    "sft_train": 20000,
    "sft_eval": 200,
    "pref_train": 8000,
    "pref_eval": 200,
    "prompts_train": 1000,
    "prompts_eval": 200,
}
MESSAGES_FRACTION = 0.2  # of sft_train, written in chat `messages` form
FULL_STOP_FRACTION = {"en": 0.0, "zh": 0.8}  # of sft_train's replies, ending in "。" (see above)
RANKED_FRACTION = 0.05  # of pref_train, written as a ranked `responses` list instead of one pair


@dataclass(frozen=True)
class Problem:
    word: str
    task = "reversal"

    @property
    def answer(self) -> str:
        return spell(self.word[::-1])

    def prompt(self, lang: str) -> str:
        return TEMPLATES[lang].format(word=spell(self.word))


def spell(word: str) -> str:
    return " ".join(word)


def random_word(rng: Random) -> str:
    while True:
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.choice(WORD_LENGTHS)))
        if word != word[::-1]:  # a palindrome's reversal is itself: the "unreversed" wrong answer would be right
            return word


def reversal_split(rng: Random, train_size: int) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) words; no eval word or its reversal is among the training words."""
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
    return [Problem(w) for w in train], [Problem(w) for w in held]


def sample_prompts(problems: list[Problem], n: int, rng: Random) -> list[tuple[Problem, str, str]]:
    """n distinct (problem, language, prompt) triples, the two languages mixed."""
    chosen, seen = [], set()
    while len(chosen) < n:
        problem, lang = rng.choice(problems), rng.choice(("en", "zh"))
        prompt = problem.prompt(lang)
        if prompt not in seen:
            seen.add(prompt)
            chosen.append((problem, lang, prompt))
    return chosen


def near_miss(problem: Problem, rng: Random) -> str:
    """A wrong answer one slip away: two neighbouring letters swapped."""
    letters = list(problem.word[::-1])
    while "".join(letters) == problem.word[::-1]:
        i = rng.randrange(len(letters) - 1)
        letters[i], letters[i + 1] = letters[i + 1], letters[i]
    return spell("".join(letters))


def far_miss(problem: Problem) -> str:
    """A wrong answer that ignores the question: the word not reversed."""
    return spell(problem.word)


def wrong_answer(problem: Problem, rng: Random) -> str:
    return near_miss(problem, rng) if rng.random() < 0.6 else far_miss(problem)


def labels(problem: Problem, lang: str) -> dict:
    return {"answer": problem.answer, "task": problem.task, "lang": lang}


def sft_records(items, rng: Random, messages_fraction: float,
                full_stop: tuple[Random, dict[str, float]] | None = None) -> list[dict]:
    """SFT rows. With `full_stop` = (its own rng, share per language), that share of each
    language's replies ends in "。" (the demonstrators' habit); `answer` stays the bare answer."""
    records = []
    for problem, lang, prompt in items:
        reply = problem.answer
        if full_stop and full_stop[0].random() < full_stop[1][lang]:
            reply += "。"
        if rng.random() < messages_fraction:
            chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
            records.append({"messages": chat, **labels(problem, lang)})
        else:
            records.append({"prompt": prompt, "response": reply, **labels(problem, lang)})
    return records


def preference_records(items, rng: Random, ranked_fraction: float) -> list[dict]:
    records = []
    for problem, lang, prompt in items:
        if rng.random() < ranked_fraction:
            ranked = [problem.answer, near_miss(problem, rng), far_miss(problem)]
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
    train, evaluation = reversal_split(rng, TRAIN_WORDS)

    def items(name: str):
        return sample_prompts(evaluation if name.endswith("_eval") else train, SIZES[name], rng)

    return {
        # the full stops draw from their own generator: every other choice stays as without them
        "sft_train": sft_records(items("sft_train"), rng, MESSAGES_FRACTION,
                                 (Random(seed + 1), FULL_STOP_FRACTION)),
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
