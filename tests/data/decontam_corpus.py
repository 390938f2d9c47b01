"""A planted corpus for the decontamination tests and bench: items of the demo's evaluation
files hidden in generated English and Chinese documents, verbatim, disguised (punctuation,
full-width forms, whitespace, case) or with a fifth of their words edited, among documents
that share only short phrases (at most 7 tokens) with the items."""

from __future__ import annotations

import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EVAL_DATA = REPO / "recipes/demo/data/eval"
EVAL_FILES = sorted(EVAL_DATA.glob("*.jsonl"))
LETTERS = "ABCDEFGHIJ"

EN_WORDS = ("the of and to in is was for on that with as by at from this are be it an or which "
            "river garden music history table window letter market winter summer morning city "
            "village teacher student number function module value system water light stone "
            "paper story people country answer question simple common small large early late "
            "write read build open close return hold change follow carry begin finish").split()
ZH_CHARS = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经"


def is_chinese(text: str) -> bool:
    return any("\u4e00" <= c <= "\u9fff" for c in text)


def planted_items() -> list[tuple[str, int, str]]:
    """(file name, row from 1, text) of each item: a question and its gold answer, or a prompt
    and its reference, as a leak would show them."""
    items = []
    for path in EVAL_FILES:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            row = json.loads(line)
            if "question" in row:
                choices = row.get("choices") or [row[k] for k in LETTERS if k in row]
                answer = row["answer"]
                gold = choices[LETTERS.index(answer) if isinstance(answer, str) else answer]
                items.append((path.name, n, f"{row['question']} {gold}"))
            else:
                items.append((path.name, n, f"{row['prompt']} {row['reference']}"))
    return items


def tokens(text: str) -> list[str]:
    """Words, and Chinese characters one by one (what the index compares), punctuation dropped."""
    out, word = [], ""
    for c in text:
        if c.isalnum() and not is_chinese(c):
            word += c.lower()
            continue
        if word:
            out.append(word)
            word = ""
        if is_chinese(c):
            out.append(c)
    return out + ([word] if word else [])


def disguise(text: str, rng: random.Random) -> str:
    """The same words in another dress: full-width letters and digits, flipped case, other
    punctuation between words, runs of spaces, tabs and line breaks, ideographic spaces."""
    swap = {"?": "？", "？": "?", ",": "，", "，": ",", "。": ".", "“": '"', "”": '"', "《": "<",
            "》": ">", ":": "：", "!": "！"}
    out = []
    for c in text:
        if c in swap:
            c = swap[c]
        elif c.isascii() and c.isalnum() and rng.random() < 0.3:
            c = chr(ord(c) + 0xFEE0)
        elif c.isalpha() and rng.random() < 0.5:
            c = c.swapcase()
        elif c == " ":
            c = rng.choice(["  ", "\n", "\t", " \u3000", " -- ", ", "])
        out.append(c)
        if is_chinese(c) and rng.random() < 0.3:
            out.append(rng.choice([" ", "、", "\u3000", "... "]))
    return "".join(out)


def edit_words(text: str, rng: random.Random, share: float = 0.2) -> str:
    """A fifth of the words (of the characters, in Chinese) replaced by others."""
    if is_chinese(text):
        chars = list(text)
        han = [i for i, c in enumerate(chars) if is_chinese(c)]
        for i in rng.sample(han, max(1, round(share * len(han)))):
            chars[i] = rng.choice(ZH_CHARS)
        return "".join(chars)
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, round(share * len(words)))):
        words[i] = rng.choice(EN_WORDS)
    return " ".join(words)


def common_phrases(items) -> list[str]:
    """Pieces of the items at most 7 tokens long ("which of the following", "的下一句是"):
    what clean documents share with a benchmark without copying it."""
    phrases = []
    for _, _, text in items:
        toks = tokens(text)
        for start in range(0, max(1, len(toks) - 3), 3):
            piece = toks[start:start + 7]
            phrases.append(("" if is_chinese(piece[0]) else " ").join(piece))
    return phrases


def background(rng: random.Random, chinese: bool, phrases: list[str]) -> str:
    if chinese:
        parts = ["".join(rng.choices(ZH_CHARS, k=rng.randint(8, 20))) + "。" for _ in range(12)]
    else:
        parts = [" ".join(rng.choices(EN_WORDS, k=rng.randint(6, 14))).capitalize() + "."
                 for _ in range(8)]
    for _ in range(3):
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(phrases))
    return " ".join(parts) if not chinese else "".join(parts)


def planted_corpus(clean_docs: int = 10_000, per_kind: int = 50, seed: int = 0):
    """(rows, planted): `clean_docs` documents with no item, then per kind (verbatim, disguised,
    edited) `per_kind` documents with one item each; planted[id] = (kind, "file:row"). Items
    shorter than 8 tokens are not planted: the index skips them (and says so)."""
    rng = random.Random(seed)
    items = [i for i in planted_items() if len(tokens(i[2])) >= 8]
    phrases = common_phrases(planted_items())
    rows, planted = [], {}
    for n in range(clean_docs):
        rows.append({"id": f"clean{n}", "text": background(rng, n % 2 == 1, phrases)})
    kinds = {"verbatim": lambda t: t, "disguised": lambda t: disguise(t, rng),
             "edited": lambda t: edit_words(t, rng)}
    for kind, change in kinds.items():
        for n, (name, row, text) in enumerate(rng.choices(items, k=per_kind)):
            host = background(rng, is_chinese(text) != (n % 10 == 0), phrases)  # some mixed
            cut = rng.randrange(len(host))
            doc_id = f"{kind}{n}"
            rows.append({"id": doc_id, "text": f"{host[:cut]} {change(text)} {host[cut:]}"})
            planted[doc_id] = (kind, f"{name}:{row}")
    return rows, planted
