"""The `long` eval task: can the model use its context? A needle-in-a-haystack test and RULER's
retrieval and tracking tests (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your
Long-Context Language Models?"), generated here, offline and seeded, at given lengths and depths.

Tests (`long.tests`):
- `needle`: one fact ("The best thing to do in Lisbon is to ride the old tram.") in the haystack;
  the question asks for it (Kamradt's needle in a haystack, with a fact drawn per sample);
- `single_key`: one "special magic number" for a key (RULER niah_single);
- `multi_key`: `long.keys` magic numbers for different keys, one asked, the others distractors
  (RULER niah_multikey);
- `variable_tracking`: a chain of `long.hops` assignments (VAR QXKRM = 40215, VAR BTWZA = VAR QXKRM,
  ...); the question asks every variable holding the value (RULER vt).

Haystacks are the repository's own text (recipes/demo/data/raw): Python docstrings in English,
fortunes-zh prose and Tang poems in Chinese, one line a unit, from a seeded place in the corpus.
A sample is `length` tokens of the model's tokenizer at most, the reply included: the prompt holds
length - max_new_tokens tokens at most, as close to it as whole lines allow. `depth` places the asked
needle (the chain's first assignment) among the haystack's tokens: 0 at its start, 1 at its end, just
before the question; the other needles go at seeded places (a chain's later links after its first).
The prompt ends with the answer's opening words (RULER's answer prefix), after the chat template's
assistant turn where the model answers in chats.

Scoring (each sample): `score`, the share of the answer's references in the reply (ignoring case;
RULER's string_match_all), and `exact_match`, the reply being the answer (up to case, spaces and a
final full stop; for variable tracking, exactly the chain's variables). Results are per (test,
language, length, depth) cell. A length beyond the model's max_seq_len is evaluated with its RoPE
as it is, positions extrapolated (what a model does when used past its window); the results mark it.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from llmkit.errors import ConfigError, UserError
from llmkit.eval.generation import contains_rate
from llmkit.model.config import ContextExtension

TESTS = ("needle", "single_key", "multi_key", "variable_tracking")
LANGS = ("en", "zh")
CORPUS = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "data" / "raw"
HAYSTACK_FILES = {"en": ["en_docstrings.jsonl.gz"], "zh": ["zh_prose.jsonl", "zh_poems.jsonl"]}
SAMPLES_FILE = "long-context.jsonl"


@dataclass
class LongContextConfig:
    tests: list[str] = field(default_factory=lambda: list(TESTS))  # any of TESTS
    lengths: list[int] = field(default_factory=lambda: [1024, 2048])  # tokens of a sample, reply included
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])  # where the needle sits
    langs: list[str] = field(default_factory=lambda: list(LANGS))  # haystack and question languages
    samples: int = 2                # samples per (test, language, length, depth) cell
    seed: int = 0                   # the samples' seed: same seed, same prompts
    keys: int = 4                   # multi_key: magic numbers in the haystack (one asked)
    hops: int = 4                   # variable_tracking: variables in the chain
    max_new_tokens: int = 32        # reply length limit
    batch_size: int = 1             # prompts generated together (a long prompt's cache is large)

    def __post_init__(self):
        for key, values, valid in (("tests", self.tests, TESTS), ("langs", self.langs, LANGS)):
            bad = [v for v in values if v not in valid]
            if bad or not values:
                raise ConfigError(f"long.{key}: unknown {', '.join(bad) or '(none given)'}; "
                                  f"choose from {', '.join(valid)}")
        if not self.lengths or min(self.lengths) < 1:
            raise ConfigError(f"long.lengths must be token counts ≥ 1, got {self.lengths}")
        if not self.depths or not all(0 <= d <= 1 for d in self.depths):
            raise ConfigError(f"long.depths must be fractions in [0, 1], got {self.depths}")
        for key in ("samples", "keys", "hops", "max_new_tokens", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"long.{key} must be ≥ 1, got {getattr(self, key)}")


# -- needles -------------------------------------------------------------------------------------

CITIES = {"en": ["Lisbon", "Kyoto", "Oslo", "Cairo", "Lima", "Hanoi", "Quebec", "Porto", "Tunis", "Riga"],
          "zh": ["杭州", "成都", "西安", "大理", "青岛", "苏州", "桂林", "洛阳", "厦门", "拉萨"]}
ACTIVITIES = {"en": ["ride the old tram", "eat a pear under the bridge", "climb the red tower",
                     "fly a paper kite", "swim in the cold lake", "read in the rose garden"],
              "zh": ["坐老电车", "在桥下吃梨", "登红塔", "放纸风筝", "在冷湖里游泳", "在玫瑰园读书"]}
KEY_WORDS = {"en": ["amber", "brisk", "cedar", "dusty", "ember", "frost", "glade", "hollow", "ivory", "jade",
                    "maple", "north", "olive", "quiet", "raven", "silver", "timber", "violet", "willow"],
             "zh": ["青山", "白云", "明月", "春风", "秋水", "松林", "梅花", "江南", "北斗", "长河", "晚霞",
                    "细雨", "孤舟", "古道", "落叶", "烟波"]}

PHRASES = {
    "en": dict(
        fact="The best thing to do in {city} is to {activity}.",
        fact_intro="A fact is hidden within the following text. Read it; I will ask about it afterwards.",
        fact_question="What is the best thing to do in {city}?",
        fact_prefix="The best thing to do in {city} is to",
        magic="One of the special magic numbers for {key} is: {value}.",
        magic_intro="Some special magic numbers are hidden within the following text. Make sure to memorize "
                    "it. I will quiz you about the numbers afterwards.",
        magic_question="What is the special magic number for {key} mentioned in the provided text?",
        magic_prefix="The special magic number for {key} mentioned in the provided text is",
        assign="VAR {name} = {value}.",
        vt_intro="Memorize and track the chain of variable assignments hidden in the following text.",
        vt_question="Find all variables that are assigned the value {value} in the text above.",
        vt_prefix="According to the chain of variable assignments in the text above, {hops} variables are "
                  "assigned the value {value}, they are:"),
    "zh": dict(
        fact="在{city}最值得做的事是{activity}。",
        fact_intro="下面的文字里藏着一个事实。请读完，之后我会就它提问。",
        fact_question="在{city}最值得做的事是什么？",
        fact_prefix="在{city}最值得做的事是",
        magic="{key}的特殊魔法数字之一是：{value}。",
        magic_intro="下面的文字里藏着一些特殊魔法数字。请记住它们，之后我会就这些数字提问。",
        magic_question="上文提到的{key}的特殊魔法数字是多少？",
        magic_prefix="上文提到的{key}的特殊魔法数字是",
        assign="变量 {name} = {value}。",
        vt_intro="请记住并追踪下面文字中隐藏的变量赋值链。",
        vt_question="找出上文中所有被赋值为 {value} 的变量。",
        vt_prefix="根据上文的变量赋值链，共有 {hops} 个变量被赋值为 {value}，它们是："),
}


@dataclass
class Needles:
    """What a test hides and asks: the needles in haystack order (the asked one first), the prompt's
    opening and question, the answer's opening words, and the references a reply is scored against."""

    sentences: list[str]
    intro: str
    question: str
    answer_prefix: str
    references: list[str]
    chain: bool = False  # the sentences keep their order in the haystack (variable tracking)


def make_needles(test: str, lang: str, rng: random.Random, cfg: LongContextConfig) -> Needles:
    p = PHRASES[lang]
    if test == "needle":
        city, activity = rng.choice(CITIES[lang]), rng.choice(ACTIVITIES[lang])
        return Needles([p["fact"].format(city=city, activity=activity)], p["fact_intro"],
                       p["fact_question"].format(city=city), p["fact_prefix"].format(city=city), [activity])
    if test in ("single_key", "multi_key"):
        count = cfg.keys if test == "multi_key" else 1
        keys = [f"{a}-{b}" if lang == "en" else a + b
                for a, b in (rng.sample(KEY_WORDS[lang], 2) for _ in range(count))]
        keys = list(dict.fromkeys(keys))  # a repeated key would make the question ambiguous
        values = [str(rng.randrange(1_000_000, 10_000_000)) for _ in keys]
        return Needles([p["magic"].format(key=k, value=v) for k, v in zip(keys, values)], p["magic_intro"],
                       p["magic_question"].format(key=keys[0]), p["magic_prefix"].format(key=keys[0]),
                       [values[0]])
    names: list[str] = []
    while len(names) < cfg.hops:
        name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if name not in names:
            names.append(name)
    value = str(rng.randrange(10_000, 100_000))
    links = [p["assign"].format(name=names[0], value=value)]
    links += [p["assign"].format(name=b, value=f"VAR {a}") for a, b in zip(names, names[1:])]
    return Needles(links, p["vt_intro"], p["vt_question"].format(value=value),
                   p["vt_prefix"].format(hops=cfg.hops, value=value), names, chain=True)


# -- haystacks -----------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def haystack_lines(lang: str) -> tuple[str, ...]:
    """The corpus of `lang`, one non-empty line a unit, in file order."""
    lines: list[str] = []
    for name in HAYSTACK_FILES[lang]:
        path = CORPUS / name
        if not path.is_file():
            raise UserError(f"long: the {lang} haystack {path} is missing (it ships with the repository's "
                            "recipes/demo/data/raw)")
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            for row in f:
                lines += [s.strip() for s in json.loads(row)["text"].splitlines() if s.strip()]
    return tuple(lines)


class Haystack:
    """A language's corpus lines and their token counts under one tokenizer (counted once)."""

    def __init__(self, lang: str, tokenizer):
        self.lines, self.tokenizer, self._tokens = haystack_lines(lang), tokenizer, {}

    def tokens(self, i: int) -> int:
        i %= len(self.lines)
        if i not in self._tokens:
            self._tokens[i] = len(self.tokenizer.encode(self.lines[i] + "\n"))
        return self._tokens[i]

    def take(self, start: int, budget: int) -> list[int]:
        """Indices of consecutive lines from `start` (wrapping around) that hold `budget` tokens."""
        out, total, i = [], 0, start
        while total < budget:
            out.append(i % len(self.lines))
            total += self.tokens(i)
            i += 1
        return out


# -- samples -------------------------------------------------------------------------------------

@dataclass
class Sample:
    test: str
    lang: str
    length: int
    depth: float
    ids: list[int]          # the prompt
    references: list[str]
    depth_actual: float     # haystack tokens before the asked needle / haystack tokens


def prompt_ids(tokenizer, text: str, answer_prefix: str, chat: bool) -> list[int]:
    if chat:
        head = tokenizer.encode_chat([{"role": "user", "content": text}], add_generation_prompt=True)[0]
        return [*head, *tokenizer.encode(answer_prefix)]
    return [*tokenizer.document_start_ids(), *tokenizer.encode(f"{text}\n{answer_prefix}")]


def build_sample(test: str, lang: str, length: int, depth: float, index: int, cfg: LongContextConfig,
                 haystack: Haystack, chat: bool) -> Sample:
    """One prompt of at most length - max_new_tokens tokens; the same arguments give the same prompt."""
    rng = random.Random(f"{cfg.seed}|{test}|{lang}|{length}|{depth}|{index}")
    needles = make_needles(test, lang, rng, cfg)
    tokenizer, limit = haystack.tokenizer, length - cfg.max_new_tokens
    frame = len(prompt_ids(tokenizer, _text(needles, needles.sentences), needles.answer_prefix, chat))
    if frame + 8 > limit:
        raise ConfigError(f"long.lengths: {length} tokens leave no room for a haystack in the {test} test "
                          f"({frame} tokens of question and needles, {cfg.max_new_tokens} of reply); "
                          "give longer lengths")
    taken = haystack.take(rng.randrange(len(haystack.lines)), limit - frame)
    others = [rng.random() for _ in needles.sentences[1:]]  # where the other needles go, as fractions
    while True:
        lines = [haystack.lines[i] for i in taken]
        boundary = _boundary([haystack.tokens(i) for i in taken], depth)
        placed = _place(lines, needles, boundary, others)
        ids = prompt_ids(tokenizer, _text(needles, placed), needles.answer_prefix, chat)
        if len(ids) <= limit or not taken:
            break
        over, cut = len(ids) - limit, 0  # drop lines from the end until they free as many tokens
        while cut < over and taken:
            cut += haystack.tokens(taken.pop())
    hay = len(tokenizer.encode("\n".join(lines))) if lines else 0
    before = len(tokenizer.encode("\n".join(lines[:boundary]))) if boundary else 0
    return Sample(test, lang, length, depth, ids, needles.references, before / hay if hay else depth)


def _boundary(counts: list[int], depth: float) -> int:
    """How many lines go before the asked needle: those whose tokens come nearest depth x all tokens."""
    cum, total = [0], sum(counts)
    for c in counts:
        cum.append(cum[-1] + c)
    return min(range(len(cum)), key=lambda k: abs(cum[k] - depth * total))


def _place(lines: list[str], needles: Needles, boundary: int, others: list[float]) -> list[str]:
    """The haystack lines with the asked needle after `boundary` lines, the others at `others`
    (fractions of the lines after the first for a chain, of all lines for distractors)."""
    lo = boundary if needles.chain else 0
    rest = [lo + int(r * (len(lines) - lo + 1)) for r in others]
    spots = [boundary, *(sorted(rest) if needles.chain else rest)]  # a chain's links in their order
    placed = list(lines)
    # from the last spot back, so that an insertion leaves the earlier spots where they are
    for spot, k in sorted(zip(spots, range(len(spots))), key=lambda t: (t[0], t[1]), reverse=True):
        placed.insert(spot, needles.sentences[k])
    return placed


def _text(needles: Needles, body: list[str]) -> str:
    return f"{needles.intro}\n\n" + "\n".join(body) + f"\n\n{needles.question}"


# -- scoring -------------------------------------------------------------------------------------

def score_reply(reply: str, references: list[str], chain: bool) -> tuple[float, bool]:
    """(share of the references the reply holds, whether the reply is exactly the answer)."""
    found = [contains_rate([reply], [[r]]) for r in references]
    score = sum(found) / len(references)
    if chain:
        exact = set(re.findall(r"[A-Z]{5}", reply)) == set(references)
    else:
        exact = reply.strip().rstrip(".。!！ ").strip().casefold() == references[0].casefold()
    return score, exact


# -- the task ------------------------------------------------------------------------------------

def evaluate_long_context(model, tokenizer, cfg: LongContextConfig, *, chat: bool,
                          device) -> tuple[dict, list[dict]]:
    """Scores per (test, lang, length, depth) cell, and every sample's reply."""
    from llmkit.model.decoding import generate_replies
    from llmkit.model.rope import extend_context

    window, longest = model.config.max_seq_len, max(cfg.lengths)
    config, tables = model.config, (model.rope_cos, model.rope_sin)
    if longest > window:  # positions past the window, with the model's own RoPE
        extend_context(model, ContextExtension(max_seq_len=longest))
    stop_ids = [tokenizer.end_of_turn_id, tokenizer.eos_id] if chat else [tokenizer.eos_id]
    cells, samples = [], []
    try:
        for test in cfg.tests:
            for lang in cfg.langs:
                haystack = Haystack(lang, tokenizer)
                for length in cfg.lengths:
                    for depth in cfg.depths:
                        batch = [build_sample(test, lang, length, depth, i, cfg, haystack, chat)
                                 for i in range(cfg.samples)]
                        replies = generate_replies(model.to(device).eval(), [s.ids for s in batch],
                                                   stop_ids=stop_ids, pad_id=tokenizer.pad_id,
                                                   max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size)
                        cells.append(_cell(test, lang, length, depth, window, batch, replies, tokenizer,
                                           cfg, chat, samples))
    finally:
        model.config, (model.rope_cos, model.rope_sin) = config, tables
    return {"window": window, "lengths": list(cfg.lengths), "depths": list(cfg.depths),
            "cells": cells, "mean": mean_scores(cells)}, samples


def _cell(test, lang, length, depth, window, batch, replies, tokenizer, cfg, chat, samples) -> dict:
    from llmkit.model.decoding import reply_text

    scores, exact = [], []
    for s, r in zip(batch, replies):
        text = reply_text(tokenizer, r, cut=len(r) == cfg.max_new_tokens)
        if not chat:
            text = text.strip("\n").split("\n", 1)[0]
        score, hit = score_reply(text, s.references, test == "variable_tracking")
        scores.append(score)
        exact.append(hit)
        samples.append({"test": test, "lang": lang, "length": length, "depth": depth,
                        "depth_actual": round(s.depth_actual, 4), "prompt_tokens": len(s.ids),
                        "references": s.references, "reply": text.strip(), "score": score, "exact_match": hit})
    return {"test": test, "lang": lang, "length": length, "depth": depth, "beyond_window": length > window,
            "score": sum(scores) / len(scores), "exact_match": sum(exact) / len(exact), "samples": len(batch)}


def mean_scores(cells: list[dict]) -> dict:
    """Mean score of each test and language over its cells (`needle/en`), and of each length."""
    groups: dict[str, list[float]] = {}
    for c in cells:
        groups.setdefault(f"{c['test']}/{c['lang']}", []).append(c["score"])
        groups.setdefault(f"length{c['length']}", []).append(c["score"])
    return {k: sum(v) / len(v) for k, v in groups.items()}


def headline(results: dict) -> dict:
    return {f"long/{k}": v for k, v in results.get("mean", {}).items()}
