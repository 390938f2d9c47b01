"""Planted corpora for the decontamination tests and bench: items of the demo's evaluation
files hidden in generated English and Chinese documents, verbatim, disguised (punctuation,
full-width forms, whitespace, case) or with a fifth of their words edited, among documents
that share only short phrases (at most 7 tokens) with the items; and (`real_planted_corpus`)
items of those files and of a quiz whose items share instructions and whose gold answers are
sentences of real docstrings, hidden in real documents of the demo corpus beside quiz pages
that copy an instruction but no item."""

from __future__ import annotations

import gzip
import json
import random
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EVAL_DATA = REPO / "recipes/demo/data/eval"
RAW_DATA = REPO / "recipes/demo/data/raw"
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


def planted_items(files=EVAL_FILES) -> list[tuple[str, int, str]]:
    """(file name, row from 1, text) of each item: a question and its gold answer, or a prompt
    and its reference, as a leak would show them."""
    items = []
    for path in files:
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


# -- real documents, and a quiz that shares instructions and quotes docstrings -------------------

QUIZ_INSTRUCTION = ("Read the quiz question below and answer it with the name of one module from "
                    "the Python standard library.")
DOCS_INSTRUCTION = "Choose the one sentence that the documentation of this function contains:"
QUIZ = [  # three items share one instruction, three another; gold answers quote docstrings
    {"prompt": f"{QUIZ_INSTRUCTION} Which module reads and writes files in the comma separated "
               "values format used by spreadsheets?", "reference": "csv"},
    {"prompt": f"{QUIZ_INSTRUCTION} Which module turns Python objects into a byte stream and "
               "back again for storage on disk?", "reference": "pickle"},
    {"prompt": f"{QUIZ_INSTRUCTION} Which module builds command line interfaces with options, "
               "arguments and generated usage help?", "reference": "argparse"},
    {"question": f"{DOCS_INSTRUCTION} what happens on a platform that lacks the optional "
                 "scheduling functions?",
     "choices": ["If they are unavailable, using them will raise a NotImplementedError.",
                 "They silently return None on every platform.", "They print a warning.",
                 "They fall back to a slower pure Python version."], "answer": 0},
    {"question": f"{DOCS_INSTRUCTION} what does a timeout of None mean when waiting for the "
                 "child process?",
     "choices": ["It waits one second.", "If None, then there is no limit on the wait time.",
                 "It raises TimeoutError at once.", "It polls the process once."], "answer": 1},
    {"question": f"{DOCS_INSTRUCTION} in what form does the encoder hand back its encoded result?",
     "choices": ["As a list of integers.", "As a str object.",
                 "The result is returned as a bytes object.", "As a file on disk."], "answer": 2},
    {"question": "Which Python statement leaves a loop early, skipping the rest of its iterations?",
     "choices": ["continue", "pass", "return", "break"], "answer": 3},
    {"prompt": "What does the strip method of a Python string return?",
     "reference": "It returns a copy of the string with leading and trailing whitespace removed."},
]
QUIZ_PAGES = [  # an instruction of the quiz with questions that are not its items
    f"{QUIZ_INSTRUCTION} Which module compresses and decompresses files in the gzip format? gzip",
    f"{QUIZ_INSTRUCTION} Which module reads and writes files in the zip archive format? zipfile",
    f"{QUIZ_INSTRUCTION} Which module turns Python objects into text in the JSON format? json",
    f"{DOCS_INSTRUCTION} what happens when the file does not exist? FileNotFoundError is raised.",
    f"{DOCS_INSTRUCTION} what does a negative size mean? Read until the end of the stream.",
]


def write_quiz(folder: Path) -> Path:
    path = Path(folder) / "quiz.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in QUIZ), encoding="utf-8")
    return path


def folded_tokens(text: str) -> str:
    """The text's words and Chinese characters, compatibility forms folded, one space between:
    an item is in a document when its folded tokens are a run of the document's."""
    return " ".join(tokens(unicodedata.normalize("NFKC", text)))


def real_documents() -> list[dict]:
    """About 900 real documents of the demo corpus: a third of its docstrings (and every one
    that quotes a gold answer of QUIZ), a third of its poems, a fortieth of its prose."""
    quoted = [r["choices"][r["answer"]] for r in QUIZ if "choices" in r]

    def rows(name, every):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(RAW_DATA / name, "rt", encoding="utf-8") as f:
            return [json.loads(line) for n, line in enumerate(f) if n % every == 0 or
                    any(g in " ".join(line.split()) for g in quoted)]

    docs = rows("en_docstrings.jsonl.gz", 3) + rows("zh_poems.jsonl", 3) + rows("zh_prose.jsonl", 40)
    return [{"id": d["id"], "text": d["text"]} for d in docs]


def real_planted_corpus(quiz: Path, per_kind: int = 25, seed: int = 0):
    """(rows, planted): the real documents, then per kind (verbatim, disguised) `per_kind`
    copies of one with an item of the demo's files or of `quiz` (every quiz item among the
    verbatim ones) put in, then each quiz page put in one; planted[id] = (kind, "file:row"
    or None for a quiz page)."""
    rng = random.Random(seed)
    docs = real_documents()
    quiz_items = planted_items([quiz])
    items = [i for i in planted_items() if len(tokens(i[2])) >= 8]
    rows, planted = list(docs), {}

    def plant(doc_id, text, kind, label):
        host = rng.choice(docs)["text"]
        cut = rng.randrange(len(host))
        rows.append({"id": doc_id, "text": f"{host[:cut]}\n{text}\n{host[cut:]}"})
        planted[doc_id] = (kind, label)

    for kind, change in (("verbatim", lambda t: t), ("disguised", lambda t: disguise(t, rng))):
        chosen = (quiz_items if kind == "verbatim" else []) + rng.choices(
            quiz_items + items, k=per_kind - (len(quiz_items) if kind == "verbatim" else 0))
        for n, (name, row, text) in enumerate(chosen):
            plant(f"{kind}{n}", change(text), kind, f"{name}:{row}")
    for n, page in enumerate(QUIZ_PAGES):
        plant(f"quiz_page{n}", page, "quiz page", None)
    return rows, planted
