"""Web data in: WARC/WET and HTML pages through `llmkit ingest` — main text, charset, url/domain/
date columns, a language identified by a model — and every record that is not a page
quarantined with its reason. The WARCs are written here with warcio, the reference library."""

import io
import json
import random

import pytest
from typer.testing import CliRunner
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from llmkit.cli.app import build_app
from llmkit.data.ingest import IngestConfig, run_ingest
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
    assert all(r["location"].startswith(f"{tmp_path / 'crawl.warc.gz'}@") for r in removed)
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
