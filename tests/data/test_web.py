"""Web data in: WARC/WET and HTML pages through `llmkit ingest` — main text, charset, url/domain/
date columns, a language identified by a model — and every record that is not a page
quarantined with its reason. The WARCs are written here with warcio, the reference library."""

import gzip
import html
import io
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from llmkit.cli.app import build_app
from llmkit.data.ingest import IngestConfig, run_ingest
from llmkit.core.executor import RunsOn
from llmkit.data.io import read_table
from llmkit.data.langid import language_columns
from llmkit.data.readers import read_records
from tests.conftest import write_jsonl

ZH_ARTICLE = "长城是中国古代的军事防御工程，修筑的历史可上溯到西周时期。今天它是世界文化遗产，每年吸引大量游客前来参观。"
EN_ARTICLE = ("The lighthouse keeper climbed the spiral stairs every evening to light the lamp. "
              "Ships passing the rocky coast depended on its beam through the long winter nights.")
DATE = "2024-03-05T10:00:00Z"


def page(title: str, article: str, icp: str = "京ICP备12345678号") -> str:
    """An article inside the boilerplate real sites wrap it in."""
    return (f"<!DOCTYPE html><html><head><title>{title}</title></head><body>"
            "<nav><ul><li><a href='/'>Home</a></li><li><a href='/news'>News</a></li>"
            "<li><a href='/about'>About us</a></li></ul></nav>"
            f"<main><article><h1>{title}</h1><p>{article}</p></article></main>"
            "<footer><p>Copyright 2024 Example Corp. All rights reserved.</p>"
            f"<p>{icp}</p></footer></body></html>")


class Warc:
    """A gzipped WARC built record by record."""

    def __init__(self):
        self.buf = io.BytesIO()
        self.writer = WARCWriter(self.buf, gzip=True)

    def response(self, url: str, body: bytes, content_type: str, status: str = "200 OK"):
        http = StatusAndHeaders(status, [("Content-Type", content_type)], protocol="HTTP/1.1")
        self._write(url, "response", body, http_headers=http)

    def _write(self, url: str, kind: str, body: bytes, **kw):
        self.writer.write_record(self.writer.create_warc_record(
            url, kind, payload=io.BytesIO(body), warc_headers_dict={"WARC-Date": DATE}, **kw))

    def request(self, url: str):
        self._write(url, "request", b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n")

    def conversion(self, url: str, text: str):
        self._write(url, "conversion", text.encode(), warc_content_type="text/plain")

    def save(self, path):
        path.write_bytes(self.buf.getvalue())
        return path


def ingest(make_ctx, paths, **cfg):
    b = run_ingest(make_ctx(force=True), [str(p) for p in paths], IngestConfig(**cfg))
    stats = json.loads((b.final / "manifest.json").read_text())["stats"]
    return read_table(b.final).to_pylist(), read_table(b.final / "removed").to_pylist(), stats


def mixed_warc(tmp_path):
    w = Warc()
    w.response("http://www.example.cn/changcheng.html",
               page("长城", ZH_ARTICLE).encode("gbk"), "text/html; charset=gbk")
    w.response("https://news.example.org:8443/lighthouse?id=7",
               page("The lighthouse", EN_ARTICLE).encode(), "text/html; charset=utf-8")
    w.request("https://news.example.org/")
    w.response("https://example.org/paper.pdf", b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj",
               "application/pdf")
    w.response("https://example.org/garbled.html", random.Random(0).randbytes(4000), "text/html")
    w.response("https://example.org/big.html", page("Big", EN_ARTICLE * 200).encode(),
               "text/html")
    w.response("https://example.org/moved", b"<html>moved</html>", "text/html",
               status="301 Moved Permanently")
    return w.save(tmp_path / "crawl.warc.gz")


def test_a_warc_keeps_its_html_pages_and_quarantines_every_other_record_with_a_reason(
        make_ctx, tmp_path):
    kept, removed, stats = ingest(make_ctx, [mixed_warc(tmp_path)], max_page_bytes=20_000)
    assert stats["rows_in"] == 7 == stats["rows_out"] + stats["rows_removed"]
    assert [r["url"] for r in kept] == ["http://www.example.cn/changcheng.html",
                                        "https://news.example.org:8443/lighthouse?id=7"]
    assert {r["text"].splitlines()[0]: r["reason"] for r in removed} == {
        "request https://news.example.org/": "warc_request",
        "response https://example.org/paper.pdf": "not_html",
        "response https://example.org/garbled.html": "undecodable_page",
        "response https://example.org/big.html": "page_too_large",
        "response https://example.org/moved": "http_status"}
    assert all(r["location"].startswith("crawl.warc.gz@") for r in removed)
    assert stats["removed_by_reason"] == {"http_status": 1, "not_html": 1, "page_too_large": 1,
                                          "undecodable_page": 1, "warc_request": 1}


def test_a_page_s_main_text_title_and_web_columns_are_kept_without_its_boilerplate(
        make_ctx, tmp_path):
    zh, en = ingest(make_ctx, [mixed_warc(tmp_path)], max_page_bytes=20_000)[0]
    assert ZH_ARTICLE in zh["text"] and EN_ARTICLE in en["text"]
    for row in (zh, en):
        assert "About us" not in row["text"] and "ICP" not in row["text"]
        assert "All rights reserved" not in row["text"]
    assert (zh["title"], en["title"]) == ("长城", "The lighthouse")
    assert (zh["domain"], en["domain"]) == ("www.example.cn", "news.example.org")
    assert (zh["charset"], en["charset"]) == ("gbk", "utf-8")
    assert zh["date"] == en["date"] == DATE
    assert (zh["lang_id"], zh["script"], en["lang_id"], en["script"]) == (
        "zh", "zh-Hans", "en", "latin")
    assert zh["lang_score"] > 0.5 and en["lang_score"] > 0.5
    assert zh["source"] == en["source"] == "crawl"


def test_wet_conversion_records_are_read_as_the_text_they_hold(make_ctx, tmp_path):
    w = Warc()
    w.conversion("https://example.org/a", EN_ARTICLE)
    w.conversion("https://example.fr/b", "Le chat dort sur le canapé pendant que la pluie tombe.")
    kept, removed, stats = ingest(make_ctx, [w.save(tmp_path / "crawl.warc.wet.gz")])
    assert [r["text"] for r in kept] == [EN_ARTICLE, "Le chat dort sur le canapé pendant que "
                                                     "la pluie tombe."]
    assert [r["lang_id"] for r in kept] == ["en", "fr"]
    assert [r["domain"] for r in kept] == ["example.org", "example.fr"]
    assert removed == [] and stats["rows_out"] == 2


PAGES = {  # charset -> (text of the page, the charset a detector names it by)
    "gbk": (ZH_ARTICLE, "gb18030"),
    "gb18030": ("𠀀字不在GBK里。" + ZH_ARTICLE, "gb18030"),
    "big5": ("長城是中國古代的軍事防禦工程，修築的歷史可上溯到西周時期。今天它是世界文化遺產，每年吸引大量遊客前來參觀。",
             "big5"),
    "shift_jis": ("富士山は日本で最も高い山であり、古くから信仰の対象として多くの人々に親しまれてきました。"
                  "毎年夏には多くの登山者が山頂を目指します。", "shift_jis"),
    "euc_kr": ("서울은 대한민국의 수도이며 정치와 경제의 중심지입니다. 한강이 도시를 가로질러 흐르고 "
               "많은 사람들이 강변 공원에서 휴식을 즐깁니다.", "cp949"),
}


def test_html_files_in_east_asian_charsets_are_detected_decoded_and_labelled(make_ctx, tmp_path):
    folder = tmp_path / "site"
    folder.mkdir()
    for charset, (text, _) in PAGES.items():  # no declaration: the detector must find it
        (folder / f"{charset}.html").write_bytes(page("", text, icp="ICP 12345678").encode(charset))
    kept, removed, _ = ingest(make_ctx, [folder])
    assert removed == []
    by_source = {r["source"]: r for r in kept}
    for charset, (text, detected) in PAGES.items():
        assert text in by_source[charset]["text"], charset
        assert by_source[charset]["charset"] == detected
    assert [by_source[c]["lang_id"] for c in PAGES] == ["zh", "zh", "zh", "ja", "ko"]
    assert by_source["big5"]["script"] == "zh-Hant" and by_source["gbk"]["script"] == "zh-Hans"


def test_a_declared_charset_wins_over_the_guess_and_a_lying_one_falls_back(tmp_path):
    body = page("", PAGES["big5"][0], icp="ICP 12345678").encode("big5")
    w = Warc()
    w.response("http://a.tw/", body, "text/html; charset=big5")
    w.response("http://b.tw/", body, "text/html; charset=utf-8")  # wrong: decoding fails
    w.response("http://c.tw/", body, "text/html; charset=x-no-such-charset")
    records = [rec for _, rec in read_records(w.save(tmp_path / "p.warc.gz"), IngestConfig())]
    assert [r["charset"] for r in records] == ["big5"] * 3
    assert all(PAGES["big5"][0] in r["text"] for r in records)


SENTENCES = {
    "ja": ("東京は日本の首都で、たくさんの人が毎日電車で仕事に通っています。", "zh"),
    "ko": ("오늘은 날씨가 정말 좋아서 친구들과 공원에 산책하러 갔습니다.", "other"),
    "zh-Hans": ("我们明天早上一起去图书馆学习，下午再去公园散步。", "zh-Hans"),
    "zh-Hant": ("我們明天早上一起去圖書館學習，下午再去公園散步。", "zh-Hant"),
    "fr": ("Nous irons demain matin à la bibliothèque pour étudier ensemble.", "latin"),
    "en": ("We will go to the library tomorrow morning to study together.", "latin"),
}


@pytest.mark.parametrize("lang", list(SENTENCES))
def test_the_language_model_tells_japanese_korean_both_chineses_french_and_english_apart(lang):
    text, script = SENTENCES[lang]
    cols = language_columns(text)
    assert cols["lang_id"] == lang.split("-")[0]
    assert cols["script"] == script
    assert 0.5 < cols["lang_score"] <= 1.0


def test_text_without_letters_has_an_undetermined_language():
    assert language_columns("12345 !!! 678") == {"lang_id": "und", "lang_score": 0.0,
                                                 "script": "other"}


def test_lang_id_labels_the_rows_of_any_format_when_asked_and_only_then(make_ctx, tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [{"text": SENTENCES["fr"][0]},
                                          {"text": SENTENCES["ja"][0]}])
    plain = ingest(make_ctx, [p])[0]
    assert "lang_id" not in plain[0] and [r["lang"] for r in plain] == ["latin", "zh"]
    labelled = ingest(make_ctx, [p], lang_id=True)[0]
    assert [(r["lang"], r["lang_id"]) for r in labelled] == [("latin", "fr"), ("zh", "ja")]


def test_llmkit_ingest_reads_a_warc_and_names_a_file_that_is_not_one(tmp_path):
    w = Warc()
    w.response("http://example.org/", page("Hello", EN_ARTICLE).encode(), "text/html")
    good = w.save(tmp_path / "page.warc.gz")
    ws = tmp_path / "ws"
    r = CliRunner().invoke(build_app(), ["ingest", str(good), "-w", str(ws)])
    assert r.exit_code == 0, r.output
    assert read_table(ws / "raw").column("url").to_pylist() == ["http://example.org/"]
    bad = tmp_path / "bad.warc.gz"
    bad.write_bytes(random.Random(1).randbytes(3000))
    r = CliRunner().invoke(build_app(), ["ingest", str(bad), "-w", str(ws), "--out", "bad"])
    assert r.exit_code == 2, r.output
    assert str(bad) in " ".join(r.output.split()) and "not a WARC file" in r.output


# ---------------------------------------------------------------- acceptance: a crawl of known articles

REPO = Path(__file__).resolve().parents[2]
RAW = REPO / "recipes" / "demo" / "data" / "raw"  # licences: recipes/demo/NOTICE.md
CHROME = ["首页", "新闻中心", "关于我们", "联系我们", "Home", "Products", "Contact us",
          "Related articles", "Most popular this week",
          "This site uses cookies to improve your experience. Accept all cookies",
          "京ICP备12345678号-1", "Copyright © 2024 Example Media Group. All rights reserved.",
          "Privacy policy", "Terms of use"]


def known_articles(n: int) -> list[tuple[str, str]]:
    """(lang, article): n Chinese (GBK-encodable, for the GBK pages) and n English texts."""
    with open(RAW / "zh_prose.jsonl", encoding="utf-8") as f:
        zh = [r["text"] for r in map(json.loads, f) if r["planted"] == "none"
              and 150 <= len(r["text"]) <= 800 and _gbk(r["text"])]
    with gzip.open(RAW / "en_docstrings.jsonl.gz", "rt", encoding="utf-8") as f:
        en = [r["text"] for r in map(json.loads, f) if 300 <= len(r["text"]) <= 1500]
    return [("zh", t) for t in zh[:n]] + [("en", t) for t in en[:n]]


def _gbk(text: str) -> bool:
    try:
        text.encode("gbk")
    except UnicodeEncodeError:
        return False
    return True


def chrome_page(title: str, article: str, meta: str = "utf-8") -> str:
    """The article in a site's navigation, cookie banner, sidebar and footer."""
    def links(words):
        return "".join(f"<li><a href='/{i}'>{w}</a></li>" for i, w in enumerate(words))
    paras = "".join(f"<p>{html.escape(p)}</p>" for p in article.split("\n") if p.strip())
    return (f"<!DOCTYPE html><html><head><meta charset='{meta}'><title>{title}</title></head>"
            f"<body><header><nav><ul>{links(CHROME[:7])}</ul></nav></header>"
            f"<div class='cookie-banner'>{CHROME[9]}</div>"
            f"<main><article><h1>{title}</h1>{paras}</article>"
            f"<aside class='sidebar'><ul>{links(CHROME[7:9])}</ul></aside></main>"
            f"<footer><p>{CHROME[10]}</p><p>{CHROME[11]}</p>"
            f"<a href='/p'>{CHROME[12]}</a> <a href='/t'>{CHROME[13]}</a></footer></body></html>")


def lcs(a: list, b: list) -> int:
    """Longest common subsequence (bit-parallel: one big-int step per item of b)."""
    masks: dict = {}
    for i, x in enumerate(a):
        masks[x] = masks.get(x, 0) | (1 << i)
    full = v = (1 << len(a)) - 1
    for y in b:
        u = v & masks.get(y, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def rouge_l(extract: str, article: str, lang: str) -> float:
    """ROUGE-L F1: characters for Chinese, words for English."""
    def units(text):
        return re.findall(r"\w", text) if lang == "zh" else re.findall(r"\w+", text.lower())
    a, b = units(article), units(extract)
    n = lcs(a, b) if a and b else 0
    return 0.0 if n == 0 else 2 * (n / len(b)) * (n / len(a)) / (n / len(b) + n / len(a))


def member(url: str, body: bytes, ctype: str = "text/html", status: str = "200 OK",
           kind: str = "response") -> bytes:
    """One record as the gzip member a crawler writes."""
    buf = io.BytesIO()
    w = WARCWriter(buf, gzip=True)
    http = StatusAndHeaders(status, [("Content-Type", ctype)], protocol="HTTP/1.1") \
        if kind == "response" else None
    w.write_record(w.create_warc_record(url, kind, payload=io.BytesIO(body), http_headers=http,
                                        warc_headers_dict={"WARC-Date": DATE}))
    return buf.getvalue()


def lying_length(record: bytes, length: int) -> bytes:
    raw = re.sub(rb"Content-Length: \d+\r\n", b"Content-Length: %d\r\n" % length,
                 gzip.decompress(record), count=1)
    return gzip.compress(raw)


def crawl(folder: Path, files: int = 4) -> tuple[Path, dict, Counter]:
    """WARC files of 110 Chinese pages (half UTF-8, half GBK: declared by HTTP or only by
    <meta>) and 110 English ones, each a known article, among records that are not pages.
    (files, url -> (lang, article), the reasons the others must be quarantined for)."""
    folder.mkdir(exist_ok=True)
    pages, members = {}, [[] for _ in range(files)]
    for i, (lang, article) in enumerate(known_articles(110)):
        url = f"https://site{i % 7}.example/{lang}/{i}.html"
        pages[url] = (lang, article)
        if lang == "zh" and i % 2:
            body, ctype = chrome_page(f"第{i}篇", article, "gbk").encode("gbk", "xmlcharrefreplace"), \
                ("text/html; charset=gbk" if i % 4 == 1 else "text/html")
        else:
            body, ctype = chrome_page(f"Article {i}", article).encode(), "text/html; charset=utf-8"
        members[i % files].append(member(url, body, ctype))
    bad = Counter()
    for k, m in enumerate(members):
        m.insert(3, member(f"https://x.example/{k}.pdf", b"%PDF-1.4\n%\xe2\xe3", "application/pdf"))
        m.insert(5, member(f"https://x.example/{k}.png", b"\x89PNG\r\n\x1a\n", "image/png"))
        m.insert(7, member(f"https://x.example/{k}/gone", b"<html>gone</html>", status="404 Not Found"))
        m.insert(9, member(f"https://x.example/{k}", b"GET / HTTP/1.1\r\n\r\n", kind="request"))
        m.insert(11, member(f"https://x.example/{k}/cut", b"<html>" + b"x" * 5000)[:300])
        m.insert(13, lying_length(member(f"https://x.example/{k}/lie", chrome_page("", "短文").encode()), 90))
        bad.update(["not_html", "not_html", "http_status", "warc_request", "corrupt_gzip_member",
                    "content_length_mismatch"])
    paths = []
    for k, m in enumerate(members):
        paths.append(folder / f"crawl-{k}.warc.gz")
        paths[-1].write_bytes(b"".join(m))
    return folder, pages, bad


def test_known_articles_come_out_of_their_boilerplate_and_every_other_record_is_quarantined(
        make_ctx, tmp_path):
    folder, pages, bad = crawl(tmp_path / "crawl")
    kept, removed, stats = ingest(make_ctx, [folder])
    assert stats["records_in"] == len(pages) + sum(bad.values())
    assert stats["records_in"] == stats["rows_out"] + stats["rows_removed"]
    assert Counter(r["reason"] for r in removed) == bad and stats["removed_by_reason"] == bad
    assert sorted(r["url"] for r in kept) == sorted(pages)
    scores = {"zh": [], "en": []}
    chrome_kept = 0
    for row in kept:
        lang, article = pages[row["url"]]
        scores[lang].append(rouge_l(row["text"], article, lang))
        chrome_kept += sum(line.strip() in CHROME for line in row["text"].splitlines())
    assert min(len(s) for s in scores.values()) >= 100
    assert statistics.mean(scores["zh"]) >= 0.90 and statistics.mean(scores["en"]) >= 0.90
    assert chrome_kept <= 0.02 * len(CHROME) * len(kept)
    gbk = [r for r in kept if r["charset"] in ("gbk", "gb18030")]
    assert len(gbk) == 55 and all(r["lang_id"] == "zh" and r["script"] == "zh-Hans" for r in gbk)


def artifact_bytes(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*.parquet"))}


def test_the_crawl_gives_the_same_artifact_on_one_and_two_workers(make_ctx, tmp_path):
    folder = crawl(tmp_path / "crawl")[0]
    cfg = IngestConfig(task_bytes=1)  # a task per file
    one = run_ingest(make_ctx(force=True, out="one"), [str(folder)], cfg).final
    two = run_ingest(make_ctx(force=True, out="two"), [str(folder)],
                     IngestConfig(task_bytes=1, run=RunsOn(workers=2))).final
    assert artifact_bytes(one) == artifact_bytes(two) and len(artifact_bytes(one)) >= 8
    assert read_table(one).num_rows == 220  # every page, past the broken records


@pytest.mark.slow
def test_the_crawl_gives_the_same_artifact_on_ray(make_ctx, tmp_path):
    pytest.importorskip("ray")
    from llmkit.core.executor import RayConfig

    folder = crawl(tmp_path / "crawl", files=2)[0]
    local = run_ingest(make_ctx(force=True, out="local"), [str(folder)],
                       IngestConfig(task_bytes=1)).final
    try:
        ray = run_ingest(make_ctx(force=True, out="ray"), [str(folder)],
                         IngestConfig(task_bytes=1, run=RunsOn(executor="ray", ray=RayConfig(num_cpus=1)))).final
    finally:  # the local cluster started here: later tests of this process expect none
        sys.modules["ray"].shutdown()
    assert artifact_bytes(local) == artifact_bytes(ray)


def test_hostile_records_are_each_quarantined_and_the_rest_ingested_with_exit_0(tmp_path):
    good = [member(f"https://ok.example/{i}", chrome_page(f"Article {i}", EN_ARTICLE).encode())
            for i in range(3)]
    page = chrome_page("", EN_ARTICLE).encode()
    hostile = {
        "corrupt_gzip_member": member("https://bad.example/cut", page)[:200],
        "content_length_mismatch": lying_length(member("https://bad.example/short", page), 120),
        "truncated_record": lying_length(member("https://bad.example/long", page), 99_999),
        "page_too_large": member("https://bad.example/huge", b"<html><body><p>" +
                                 b"fifty megabytes " * (50 * 2**20 // 16) + b"</p></body></html>"),
        "undecodable_page": member("https://bad.example/klingon",
                                   random.Random(3).randbytes(6000), "text/html; charset=x-klingon"),
    }
    path = tmp_path / "hostile.warc.gz"
    path.write_bytes(b"".join([good[0], *hostile.values(), good[1], good[2]]))
    ws = tmp_path / "ws"
    r = CliRunner().invoke(build_app(), ["ingest", str(path), "-w", str(ws)])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert read_table(ws / "raw").column("url").to_pylist() == [f"https://ok.example/{i}"
                                                                 for i in range(3)]
    removed = read_table(ws / "raw" / "removed").to_pylist()
    assert sorted(r["reason"] for r in removed) == sorted(hostile)
    stats = json.loads((ws / "raw" / "manifest.json").read_text())["stats"]
    assert stats["records_in"] == 8 == stats["rows_out"] + stats["rows_removed"]


def llmkit(*args, kill_at: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "LLMKIT_KILL_AT"}
    env.update(OMP_NUM_THREADS="1", **({"LLMKIT_KILL_AT": kill_at} if kill_at else {}))
    return subprocess.run([sys.executable, "-c", "from llmkit.cli.app import main; main()",
                           *map(str, args)], env=env, capture_output=True).returncode


def test_an_ingest_killed_mid_warc_reruns_to_the_identical_artifact(tmp_path):
    folder = crawl(tmp_path / "crawl", files=1)[0]
    assert llmkit("ingest", folder, "-w", tmp_path / "straight") == 0
    killed = tmp_path / "killed"
    assert llmkit("ingest", folder, "-w", killed, kill_at="ingest:record@150") == -signal.SIGKILL
    assert not (killed / "raw" / "manifest.json").exists()
    assert llmkit("ingest", folder, "-w", killed) == 0
    assert artifact_bytes(killed / "raw") == artifact_bytes(tmp_path / "straight" / "raw")
