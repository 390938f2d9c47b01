"""Build tests/assets/langid_docs.jsonl: real text in nine classes for the language-ID test
(tests/data/test_langid.py), from what Debian installs on this machine.

- zh-Hans, zh-Hant, ja, ko, fr, de, es: the translations (msgstr) of Debian's message
  catalogues, /usr/share/locale/<locale>/LC_MESSAGES/*.mo (coreutils, apt, git, gtk, …);
- en: the original English messages (msgid) of the same catalogues;
- zh-code: Simplified Chinese messages around a block of Python from the standard library
  (/usr/lib/python3.11, PSF licence), as a Chinese programming page is.
A message counts when it is running text: half of it or more the letters of its class's
script (not a list of names, paper sizes or command options), Japanese with kana. A
document is consecutive such messages of one catalogue joined until it has 200 characters; at
most 3 documents per catalogue, so a class spans many packages. Each row names its file,
its Debian package and that package's licence (the first `License:` of its copyright file).
Lists of names (iso_*, xkeyboard-config) are left out: they are not running text.

    .venv/bin/python tests/assets/build_langid_docs.py
"""

from __future__ import annotations

import functools
import gettext
import json
import random
import re
import subprocess
from pathlib import Path

OUT = Path(__file__).with_name("langid_docs.jsonl")
LOCALES = {"zh-Hans": "zh_CN", "zh-Hant": "zh_TW", "ja": "ja", "ko": "ko", "fr": "fr", "de": "de",
           "es": "es"}
PER_CLASS, PER_CATALOGUE, MIN_CHARS = 60, 3, 200
SKIP = re.compile(r"^(iso_|xkeyboard|gtk\d\d-properties)")
FORMAT = re.compile(r"%(?:\d+\$)?[-#0 +']*\d*(?:\.\d+)?[hlLqjzt]*[a-zA-Z%]|\{[^}]*\}|[_&](?=\w)")
# the letters of a class's script; a message is running text when they are half of it or more
LETTERS = {"zh-Hans": "[\u4e00-\u9fff]", "zh-Hant": "[\u4e00-\u9fff]",
           "ja": "[\u3040-\u30ff\u4e00-\u9fff]", "ko": "[\uac00-\ud7af]"}
LATIN = "[A-Za-zÀ-ÿ]"
KANA = re.compile("[\u3040-\u30ff]")
PYTHON = Path("/usr/lib/python3.11")


def messages(mo: Path, original: bool) -> list[str]:
    try:
        with open(mo, "rb") as f:
            catalog = gettext.GNUTranslations(f)._catalog
    except (OSError, UnicodeDecodeError):  # a catalogue in a legacy charset: left out
        return []
    out = []
    for key, value in catalog.items():
        msgid = key[0] if isinstance(key, tuple) else key
        if not msgid or (isinstance(key, tuple) and key[1]):
            continue
        text = msgid if original else value
        if not original and value == msgid:
            continue  # not translated
        text = " ".join(FORMAT.sub("", text).split())
        if sum(c.isalpha() for c in text) >= 8:
            out.append(text.split("\x04")[-1])
    return out


@functools.cache
def package_of(path: Path) -> tuple[str, str]:
    """(Debian package, its licence as its copyright file names it first)."""
    found = subprocess.run(["dpkg", "-S", str(path)], capture_output=True, text=True).stdout
    package = found.split(":", 1)[0].strip() or "unknown"
    copyright = Path("/usr/share/doc") / package / "copyright"
    licence = "see copyright"
    if copyright.exists():
        m = re.search(r"^License:\s*(\S.*)$", copyright.read_text(errors="replace"), re.M)
        licence = m.group(1).strip() if m else licence
    return package, licence


def running_text(text: str, lang: str) -> bool:
    """Half of it letters of its script (not a list of names, sizes or options); Japanese
    with kana (Han alone is Chinese as much as Japanese)."""
    letters = len(re.findall(LETTERS.get(lang, LATIN), text))
    return 2 * letters >= len(text) and (lang != "ja" or KANA.search(text) is not None)


def documents(texts: list[str], rng: random.Random) -> list[str]:
    docs, doc = [], []
    start = rng.randrange(max(1, len(texts) - 40))
    for text in texts[start:] + texts[:start]:
        doc.append(text)
        if sum(map(len, doc)) >= MIN_CHARS:
            docs.append(" ".join(doc))
            doc = []
        if len(docs) == PER_CATALOGUE:
            break
    return docs


def class_rows(lang: str, locale: str, original: bool, rng: random.Random) -> list[dict]:
    rows = []
    for mo in sorted(Path("/usr/share/locale", locale, "LC_MESSAGES").glob("*.mo")):
        if SKIP.match(mo.name):
            continue
        texts = [t for t in messages(mo, original) if running_text(t, lang)]
        rows += [{"lang": lang, "text": text, "source": str(mo)}
                 for text in documents(texts, rng)]
    rng.shuffle(rows)
    for row in rows[:PER_CLASS]:
        row["package"], row["licence"] = package_of(Path(row["source"]))
    return rows[:PER_CLASS]


def python_blocks(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """(code, file) blocks of 4-8 lines of real Python."""
    files = sorted(p for p in PYTHON.glob("*.py") if p.stat().st_size > 5000)
    blocks = []
    while len(blocks) < n:
        path = rng.choice(files)
        lines = [line for line in path.read_text(errors="replace").splitlines()
                 if line.strip() and not line.lstrip().startswith(("#", '"', "'"))]
        i = rng.randrange(max(1, len(lines) - 8))
        blocks.append(("\n".join(lines[i:i + rng.randint(4, 8)]), str(path)))
    return blocks


def mixed_rows(zh_rows: list[dict], rng: random.Random) -> list[dict]:
    rows = []
    for row, (code, path) in zip(zh_rows, python_blocks(rng, len(zh_rows))):
        half = len(row["text"]) // 2
        text = f"{row['text'][:half]}\n\n```python\n{code}\n```\n\n{row['text'][half:]}"
        rows.append({**row, "lang": "zh-code", "text": text,
                     "source": f"{row['source']} + {path}",
                     "licence": f"{row['licence']} + PSF-2.0 (Python standard library)"})
    return rows


def main() -> None:
    rng = random.Random(31)
    rows = []
    for lang, locale in LOCALES.items():
        rows += class_rows(lang, locale, False, rng)
    zh = [r for r in rows if r["lang"] == "zh-Hans"]
    english = []
    for locale in ("fr", "de"):  # English originals, from catalogues of two locales
        english += class_rows("en", locale, True, rng)
    rows += english[:PER_CLASS] + mixed_rows(zh, random.Random(32))
    with open(OUT, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    counts = {}
    for r in rows:
        counts[r["lang"]] = counts.get(r["lang"], 0) + 1
    print(OUT, counts)


if __name__ == "__main__":
    main()
