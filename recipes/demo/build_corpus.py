"""Build the demo corpus in recipes/demo/data/raw/: real Chinese and English text plus planted noise.

The built files are committed, so users never need to run this; it documents exactly how they were
made and rebuilds them byte for byte (same Python version, same fortunes-zh version, same seed).

    python recipes/demo/build_corpus.py --fortunes-dir /usr/share/games/fortunes
    python recipes/demo/build_corpus.py --deb fortunes-zh_2.98_all.deb   # from `apt-get download fortunes-zh`

Sources (see NOTICE.md): Chinese from Debian's fortunes-zh (GPL-3.0+), English from the docstrings and
pydoc help topics of the running Python's standard library (PSF licence).

Every row has the same keys: id, text, source, lang, planted, copy_of. `planted` names the noise a row
was made to carry ("none" for real text); `copy_of` is the id of the row a duplicate was copied from.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import importlib
import inspect
import io
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from random import Random

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "raw"
DEFAULT_SEED = 20240229
MIN_EN_WORDS = 50  # shorter docstrings are mostly one-line summaries
MAX_TOPIC_WORDS = 400  # help-topic pages run to 3,000 words; chunks keep documents of docstring size
MIN_ZH_CJK = 8  # drops emoticons like "Orz" and "(╯‵□′)╯︵┻━┻" from the real set
MAX_ZH_CHARS = 1500  # the longest fortunes are Debian-manual tables; they would dominate the corpus
EXACT_DUP_FRACTION = 0.03
NEAR_DUP_FRACTION = 0.02
NEAR_DUP_EDIT_RATE = (0.03, 0.10)  # fraction of words (English) or CJK characters (Chinese) edited
NEAR_DUP_THRESHOLD = 0.5  # real documents this similar to an earlier one are dropped (llmkit dedup default)
PLANTED_PER_LANG = {  # planted category -> rows per language
    "boilerplate": 20,
    "boilerplate_lines": 10,
    "too_short": 15,
    "html_markup": 15,
    "control_chars": 15,
}
GIBBERISH_ROWS = 20  # per script: gibberish_latin and gibberish_cjk
BROKEN_VALID_ROWS = 7  # valid rows around the three malformed lines of broken.jsonl


@dataclass
class Doc:
    text: str
    source: str
    lang: str
    planted: str = "none"
    copy_of: "Doc | None" = None
    id: str = ""

    def record(self) -> dict:
        return {
            "id": self.id,
            "text": self.text,
            "source": self.source,
            "lang": self.lang,
            "planted": self.planted,
            "copy_of": self.copy_of.id if self.copy_of else "",
        }


# ---------------------------------------------------------------- Chinese: fortunes-zh

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m?")  # some records hold a broken "\x1b[;" before the next escape
CJK = re.compile(r"[\u4e00-\u9fff]")


def read_fortune_file(path: Path) -> list[str]:
    """Records of one fortune file (separated by lines holding only %), UTF-8, colour escapes removed."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # old fortunes-zh releases shipped GB2312
        text = raw.decode("gb18030")
    text = ANSI_ESCAPE.sub("", text).replace("\r\n", "\n")
    records = []
    for chunk in re.split(r"^%$", text, flags=re.M):
        lines = [line.rstrip() for line in chunk.split("\n")]
        record = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")
        if record.strip():
            records.append(record)
    return records


def chinese_docs(fortunes_dir: Path) -> dict[str, list[Doc]]:
    files = {"zh_poems": ["tang300", "song100"], "zh_prose": ["chinese"]}
    docs: dict[str, list[Doc]] = {}
    for out_name, names in files.items():
        docs[out_name] = []
        for name in names:
            path = fortunes_dir / name
            if not path.exists():
                sys.exit(f"{path} not found: pass the fortunes-zh directory (…/usr/share/games/fortunes)")
            for text in read_fortune_file(path):
                if len(CJK.findall(text)) >= MIN_ZH_CJK and len(text) <= MAX_ZH_CHARS:
                    docs[out_name].append(Doc(text, f"fortunes-zh/{name}", "zh"))
    return docs


def extract_deb(deb: Path, into: Path) -> Path:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(into)], check=True)
    return into / "usr" / "share" / "games" / "fortunes"


# ---------------------------------------------------------------- English: Python's own documentation

SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_source_docstrings(stdlib: Path) -> list[str]:
    """Docstrings of every module, class and function in the stdlib's .py files (tests excluded), by parsing."""
    found = []
    for directory, subdirs, files in os.walk(stdlib):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIP_DIRS and not d.startswith(("test", "config-")))
        for name in sorted(files):
            if not name.endswith(".py") or name.startswith("test"):
                continue
            try:
                tree = ast.parse(Path(directory, name).read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError):  # lib2to3 test data and the like
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append(ast.get_docstring(node, clean=True) or "")
    return found


def builtin_module_docstrings(stdlib: Path) -> list[str]:
    """Docstrings of C-implemented modules (builtins, math, _io, ...): they exist only at run time."""
    names = sorted(sys.builtin_module_names) + sorted(
        p.name.split(".")[0] for p in (stdlib / "lib-dynload").glob("*.so")
    )
    found = []
    for name in names:
        if "test" in name or name.startswith("xx"):
            continue
        try:
            module = importlib.import_module(name)
        except Exception:  # optional extensions whose system library is missing
            continue
        members = [v for _, v in sorted(vars(module).items()) if getattr(v, "__module__", None) == name]
        for obj in [module] + [m for m in members if inspect.isbuiltin(m) or inspect.isclass(m)]:
            found.append(obj.__doc__)
            if inspect.isclass(obj):
                found.extend(getattr(v, "__doc__", None) for _, v in sorted(vars(obj).items()))
    return [inspect.cleandoc(d) for d in found if isinstance(d, str)]


HEADING_UNDERLINE = re.compile(r"^\n?(.+)\n([=*\-~^])\2{3,}$", re.M)


def pydoc_topic_sections() -> list[str]:
    """The language-reference pages behind help("topic"), split at their headings, long sections at paragraphs."""
    from pydoc_data.topics import topics

    sections = []
    for name in sorted(topics):
        starts = [m.start(1) for m in HEADING_UNDERLINE.finditer(topics[name])] or [0]
        bounds = [0] + starts[1:] + [len(topics[name])]
        for a, b in zip(bounds, bounds[1:]):
            sections.extend(paragraph_chunks(topics[name][a:b].strip(), MAX_TOPIC_WORDS))
    return sections


def paragraph_chunks(text: str, max_words: int) -> list[str]:
    """Consecutive paragraphs grouped into chunks of at most max_words (a longer paragraph stays whole)."""
    chunks, current, words = [], [], 0
    for paragraph in text.split("\n\n"):
        n = len(paragraph.split())
        if current and words + n > max_words:
            chunks.append("\n\n".join(current))
            current, words = [], 0
        current.append(paragraph)
        words += n
    chunks.append("\n\n".join(current))
    return chunks


def english_docs() -> list[Doc]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = stdlib_source_docstrings(stdlib) + builtin_module_docstrings(stdlib) + pydoc_topic_sections()
    return [Doc(t, "python-docs", "en") for t in texts if len(t.split()) >= MIN_EN_WORDS]


# ---------------------------------------------------------------- dropping duplicates among real text


def shingles(text: str, lang: str, n: int = 3) -> set[str]:
    """Word (English) or character (Chinese) n-grams, lowercased, punctuation ignored: llmkit dedup's defaults."""
    units = re.findall(r"\w+", text.lower()) if lang == "en" else re.findall(r"\w", text.lower())
    return {" ".join(units[i : i + n]) for i in range(max(1, len(units) - n + 1))}


def jaccard(a: str, b: str, lang: str) -> float:
    sa, sb = shingles(a, lang), shingles(b, lang)
    return len(sa & sb) / len(sa | sb)


def drop_real_duplicates(docs: list[Doc]) -> list[Doc]:
    """Keep the first of each exact or near-duplicate group, so the only duplicates left are planted ones."""
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=NEAR_DUP_THRESHOLD, num_perm=128)
    seen, kept = set(), []
    for i, doc in enumerate(docs):
        if doc.text in seen:
            continue
        seen.add(doc.text)
        signature = MinHash(num_perm=128, seed=1)
        signature.update_batch(s.encode() for s in shingles(doc.text, doc.lang))
        if lsh.query(signature):
            continue
        lsh.insert(str(i), signature)
        kept.append(doc)
    return kept


# ---------------------------------------------------------------- planted noise

NAV_EN = ["Home", "About Us", "Products", "Blog", "Careers", "Contact", "Support", "Pricing", "Login", "Sign up"]
NAV_ZH = ["首页", "新闻中心", "产品展示", "关于我们", "联系我们", "加入我们", "客户服务", "登录", "注册", "网站地图"]
BOILERPLATE_EN = [
    "We use cookies to improve your experience on our site. By continuing to browse, you agree to our use of "
    "cookies. Accept all cookies | Manage preferences | Read our Cookie Policy",
    "Please enable JavaScript in your browser to view this page.",
    "This site requires JavaScript. Your browser either does not support JavaScript or it is turned off.",
    "Copyright © {year} {company} Inc. All rights reserved. Privacy Policy | Terms of Service | Sitemap",
    "Subscribe to our newsletter to get the latest updates delivered to your inbox. Enter your email address.",
    "var _gaq = _gaq || []; _gaq.push(['_setAccount', 'UA-{num}-1']); _gaq.push(['_trackPageview']);",
    "window.dataLayer = window.dataLayer || []; function gtag(){{dataLayer.push(arguments);}} gtag('js', new Date());",
    "Share this article: Facebook | Twitter | LinkedIn | Email | Print",
    "Skip to main content. Toggle navigation menu. Search this site.",
]
BOILERPLATE_ZH = [
    "本网站使用 Cookie 来提升您的浏览体验。继续浏览即表示您同意我们使用 Cookie。接受全部 | 管理设置 | 隐私政策",
    "您的浏览器不支持 JavaScript，请启用 JavaScript 后刷新页面。",
    "版权所有 © {year} {company}有限公司 保留所有权利 京ICP备{num}号",
    "扫描二维码关注我们的微信公众号，获取最新资讯。",
    "点击这里下载手机客户端，随时随地阅读更多精彩内容。",
    "分享到：微信 | 微博 | QQ空间 | 豆瓣",
    "免责声明：本站部分内容来源于网络，如有侵权请联系删除。",
    "跳转到主要内容 | 打开导航菜单 | 搜索本站",
]
COMPANIES = ["Example", "Acme", "Globex", "Initech", "Umbrella", "Hooli", "Vandelay", "Stark"]
LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et "
    "dolore magna aliqua ut enim ad minim veniam quis nostrud exercitation ullamco laboris nisi ut aliquip ex "
    "ea commodo consequat duis aute irure dolor in reprehenderit in voluptate velit esse cillum dolore eu fugiat "
    "nulla pariatur excepteur sint occaecat cupidatat non proident sunt in culpa qui officia deserunt mollit "
    "anim id est laborum"
).split()
TOO_SHORT_EN = ["Click here", "Read more", "OK", "Thanks!", "N/A", "Page {n} of 100", "Loading...", "See also: {n}",
                "Back to top", "Next page", "Untitled", "TODO", "[deleted]", "Error 404", "More ({n})"]
TOO_SHORT_ZH = ["谢谢", "好的", "顶", "沙发", "点击查看", "第{n}页", "加载中……", "暂无内容", "返回顶部", "下一页",
                "无标题", "已删除", "楼主好人", "赞（{n}）", "更多"]


def filled(template: str, rng: Random) -> str:
    return template.format(year=rng.randint(2005, 2024), company=rng.choice(COMPANIES), num=rng.randint(10**7, 10**8), n=rng.randint(2, 99))


def boilerplate_doc(lang: str, rng: Random) -> Doc:
    """A page with no content: navigation, cookie banners, scripts, copyright lines (and lorem ipsum)."""
    nav, blocks = (NAV_EN, BOILERPLATE_EN) if lang == "en" else (NAV_ZH, BOILERPLATE_ZH)
    lines = [" | ".join(rng.sample(nav, rng.randint(4, len(nav))))]
    lines += [filled(b, rng) for b in rng.sample(blocks, rng.randint(3, 5))]
    if lang == "en" and rng.random() < 0.5:
        filler = " ".join(rng.choice(LOREM) for _ in range(rng.randint(40, 80)))
        lines.insert(1, f"Lorem ipsum dolor sit amet, consectetur adipiscing elit, {filler}.")
    return Doc("\n".join(lines), "synthetic-noise", lang, "boilerplate")


def with_boilerplate_lines(doc: Doc, rng: Random) -> Doc:
    """Real text wrapped in a page's navigation and footer lines: the lines should go, the text stay."""
    nav, blocks = (NAV_EN, BOILERPLATE_EN) if doc.lang == "en" else (NAV_ZH, BOILERPLATE_ZH)
    header = " | ".join(rng.sample(nav, 5))
    footer = [filled(b, rng) for b in rng.sample(blocks, 2)]
    return Doc("\n".join([header, doc.text, *footer]), doc.source, doc.lang, "boilerplate_lines")


def gibberish_latin(rng: Random) -> Doc:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 11))) for _ in range(rng.randint(60, 150))]
    return Doc(" ".join(words), "synthetic-noise", "en", "gibberish_latin")


def gibberish_cjk(rng: Random) -> Doc:
    """Uniform draws from the CJK block: real characters, mostly rare ones, in no order."""
    chars = []
    for _ in range(rng.randint(100, 300)):
        chars.append(chr(rng.randint(0x4E00, 0x9FA5)))
        if rng.random() < 0.08:
            chars.append(rng.choice("，。、；"))
    return Doc("".join(chars), "synthetic-noise", "zh", "gibberish_cjk")


def too_short_doc(lang: str, rng: Random, index: int) -> Doc:
    templates = TOO_SHORT_EN if lang == "en" else TOO_SHORT_ZH
    return Doc(filled(templates[index % len(templates)], rng), "synthetic-noise", lang, "too_short")


HTML_ENTITIES = {"&": "&amp;", '"': "&quot;", "'": "&#39;", "<": "&lt;", ">": "&gt;",
                 "“": "&ldquo;", "”": "&rdquo;", "—": "&mdash;", "©": "&copy;"}


def with_html_markup(doc: Doc, rng: Random) -> Doc:
    """The same text as a web page would serve it: paragraphs in tags, special characters as entities."""
    text = "".join(HTML_ENTITIES.get(c, c) for c in doc.text)
    text = text.replace(" ", "&nbsp;", 2)
    paragraphs = [p.replace("\n", "<br/>\n") for p in text.split("\n\n")]
    body = "\n".join(f"<p>{p}</p>" for p in paragraphs)
    tag = rng.choice(["div", "article", "section"])
    return Doc(f'<{tag} class="content">\n{body}\n</{tag}>', doc.source, doc.lang, "html_markup")


INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u00ad", "\u2060", "\ufeff"]  # zero-width, soft hyphen, BOM
CONTROL = ["\x00", "\x07", "\x08", "\x1b", "\x7f"]  # none of them counts as whitespace


def with_control_chars(doc: Doc, rng: Random) -> Doc:
    """The same text with a BOM, zero-width and control characters, CRLF line ends and no-break spaces."""
    chars = list(doc.text.replace("\n", "\r\n"))
    for _ in range(max(3, len(chars) // 40)):
        chars.insert(rng.randrange(len(chars) + 1), rng.choice(INVISIBLE + CONTROL))
    text = "\ufeff" + "".join(chars)
    text = text.replace(" ", "\u00a0", 3).replace("，", "\u3000，", 1)
    return Doc(text, doc.source, doc.lang, "control_chars")


def exact_copy(doc: Doc) -> Doc:
    return Doc(doc.text, doc.source, doc.lang, "exact_duplicate", copy_of=doc)


def near_copy(doc: Doc, vocabulary: list[str], rng: Random) -> Doc:
    """A copy with a few percent of its words (English) or CJK characters (Chinese) replaced, dropped or added.

    The edits fall in one or two runs, as when a page is republished with a sentence changed.
    """
    if doc.lang == "en":
        units = re.split(r"(\s+)", doc.text)  # odd positions keep the original whitespace
        editable = list(range(0, len(units), 2))
    else:
        units = list(doc.text)
        editable = [i for i, c in enumerate(units) if CJK.match(c)]
    edits = max(1, round(rng.uniform(*NEAR_DUP_EDIT_RATE) * len(editable)))
    runs = min(rng.randint(1, 2), edits)
    for run in range(runs):
        length = edits // runs + (run < edits % runs)
        start = rng.randrange(len(editable) - length + 1)
        for i in editable[start : start + length]:
            op = rng.random()
            if op < 0.7:
                units[i] = rng.choice(vocabulary)
            elif op < 0.85:
                units[i] = ""
                if doc.lang == "en" and i + 1 < len(units) and "\n" not in units[i + 1]:
                    units[i + 1] = ""
            else:
                units[i] = units[i] + (" " if doc.lang == "en" else "") + rng.choice(vocabulary)
    return Doc("".join(units), doc.source, doc.lang, "near_duplicate", copy_of=doc)


def interleave_copies(originals: list[Doc], copies: list[Doc], rng: Random) -> list[Doc]:
    """Each copy lands at a random place after its original, so "keep the first" keeps the real row."""
    position = {id(d): i for i, d in enumerate(originals)}
    keyed = [(float(i), 0, d) for i, d in enumerate(originals)]
    for n, copy in enumerate(copies):
        keyed.append((rng.uniform(position[id(copy.copy_of)] + 0.5, len(originals)), n + 1, copy))
    return [d for _, _, d in sorted(keyed, key=lambda k: (k[0], k[1]))]


def plant_duplicates(docs: list[Doc], rng: Random) -> list[Doc]:
    vocabulary = [w for d in docs for w in d.text.split()] if docs[0].lang == "en" else CJK.findall(
        "".join(d.text for d in docs))
    long_enough = [d for d in docs if (len(d.text.split()) if d.lang == "en" else len(CJK.findall(d.text))) >= 100]
    copies = [exact_copy(d) for d in rng.sample(docs, round(EXACT_DUP_FRACTION * len(docs)))]
    copies += [near_copy(d, vocabulary, rng) for d in rng.sample(long_enough, round(NEAR_DUP_FRACTION * len(docs)))]
    return interleave_copies(docs, copies, rng)


def planted_noise(held_out: dict[str, list[Doc]], rng: Random) -> list[Doc]:
    """noise.jsonl: generated junk plus held-out real rows dressed in markup, control characters or page chrome."""
    noise = []
    for lang in ("en", "zh"):
        real = held_out[lang]
        noise += [boilerplate_doc(lang, rng) for _ in range(PLANTED_PER_LANG["boilerplate"])]
        noise += [too_short_doc(lang, rng, i) for i in range(PLANTED_PER_LANG["too_short"])]
        noise += [with_boilerplate_lines(real.pop(), rng) for _ in range(PLANTED_PER_LANG["boilerplate_lines"])]
        noise += [with_html_markup(real.pop(), rng) for _ in range(PLANTED_PER_LANG["html_markup"])]
        noise += [with_control_chars(real.pop(), rng) for _ in range(PLANTED_PER_LANG["control_chars"])]
    noise += [gibberish_latin(rng) for _ in range(GIBBERISH_ROWS)]
    noise += [gibberish_cjk(rng) for _ in range(GIBBERISH_ROWS)]
    rng.shuffle(noise)
    return noise


# ---------------------------------------------------------------- writing


def assign_ids(docs: list[Doc], prefix: str) -> None:
    for n, doc in enumerate(docs, start=1):
        doc.id = f"{prefix}-{n:06d}"


def jsonl_bytes(docs: list[Doc]) -> bytes:
    return "".join(json.dumps(d.record(), ensure_ascii=False) + "\n" for d in docs).encode("utf-8")


def write_file(path: Path, data: bytes) -> None:
    if path.suffix == ".gz":
        buffer = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as gz:  # mtime=0: reproducible bytes
            gz.write(data)
        data = buffer.getvalue()
    path.write_bytes(data)


def broken_jsonl(valid: list[Doc]) -> bytes:
    """Valid rows with three malformed lines among them: truncated JSON, Latin-1 bytes, Python-style quotes."""
    lines = [json.dumps(d.record(), ensure_ascii=False).encode("utf-8") for d in valid]
    bad = [
        b'{"id": "broken-bad-1", "text": "This record was cut off in the middle of a sen',
        b'{"id": "broken-bad-2", "text": "caf\xe9 cr\xe8me: Latin-1 bytes, not UTF-8"}',
        b"{'id': 'broken-bad-3', 'text': 'single quotes make a Python dict, not JSON'}",
    ]
    for position, line in zip((1, 4, 6), bad):
        lines.insert(position, line)
    return b"\n".join(lines) + b"\n"


def build(fortunes_dir: Path, out: Path, seed: int) -> dict[str, list[Doc]]:
    rng = Random(seed)
    zh_by_file = chinese_docs(fortunes_dir)
    zh_kept = {id(d) for d in drop_real_duplicates([d for docs in zh_by_file.values() for d in docs])}
    zh = {name: [d for d in docs if id(d) in zh_kept] for name, docs in zh_by_file.items()}
    en = drop_real_duplicates(english_docs())

    def hold_out(docs: list[Doc], n: int) -> list[Doc]:
        picked = set(rng.sample(range(len(docs)), n))
        held = [d for i, d in enumerate(docs) if i in picked]
        docs[:] = [d for i, d in enumerate(docs) if i not in picked]
        return held

    per_lang = sum(PLANTED_PER_LANG[k] for k in ("boilerplate_lines", "html_markup", "control_chars"))
    held_out = {"en": hold_out(en, per_lang), "zh": hold_out(zh["zh_prose"], per_lang)}
    broken_valid = hold_out(en, 4) + hold_out(zh["zh_poems"], BROKEN_VALID_ROWS - 4)

    files = {
        "en_docstrings.jsonl.gz": ("en", plant_duplicates(en, rng)),
        "zh_poems.jsonl": ("zh-poem", plant_duplicates(zh["zh_poems"], rng)),
        "zh_prose.jsonl": ("zh-prose", plant_duplicates(zh["zh_prose"], rng)),
        "noise.jsonl": ("noise", planted_noise(held_out, rng)),
        "broken.jsonl": ("broken", broken_valid),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, (prefix, docs) in files.items():
        assign_ids(docs, prefix)  # copies point at originals in their own file, so per-file ids suffice
        data = broken_jsonl(docs) if name == "broken.jsonl" else jsonl_bytes(docs)
        write_file(out / name, data)
    return {name: docs for name, (_, docs) in files.items()}


def summary(files: dict[str, list[Doc]], out: Path) -> str:
    from collections import Counter

    lines = []
    for name, docs in files.items():
        planted = Counter(d.planted for d in docs)
        size = (out / name).stat().st_size
        lines.append(f"{name}: {len(docs)} valid rows, {size:,} bytes, planted {dict(sorted(planted.items()))}")
    near = [jaccard(d.text, d.copy_of.text, d.lang) for docs in files.values() for d in docs
            if d.planted == "near_duplicate"]
    deciles = [f"{sorted(near)[len(near) * k // 10]:.2f}" for k in range(10)]
    lines.append(f"near duplicates: 3-gram Jaccard to their original, deciles {' '.join(deciles)}, max {max(near):.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--fortunes-dir", type=Path, help="directory holding tang300, song100 and chinese")
    source.add_argument("--deb", type=Path, help="fortunes-zh .deb file (from `apt-get download fortunes-zh`)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed for every random choice")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fortunes_dir = extract_deb(args.deb, Path(tmp)) if args.deb else args.fortunes_dir
        files = build(fortunes_dir, args.out, args.seed)
    print(summary(files, args.out))


if __name__ == "__main__":
    main()
