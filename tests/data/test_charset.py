"""A web page's declared charset is believed unless its bytes contradict it: ASCII bytes are not
UTF-16, valid multi-byte UTF-8 is not latin-1 — the text is kept as written, not as mojibake —
while genuine pages in what they declare keep being read so."""

import codecs

from llmkit.data.charset import contradicted
from tests.data.test_web import EN_ARTICLE, Warc, ingest, page

CAFE = ("Café au lait et crème brûlée : la pâtisserie préférée des habitués du quartier, été "
        "comme hiver, à deux pas de la gare.")


def test_bytes_contradict_utf16_without_nuls_and_a_one_byte_charset_on_multibyte_utf8():
    assert contradicted("utf-16", b"<p>plain ascii</p>")
    assert not contradicted("utf-16", "<p>plain ascii</p>".encode("utf-16"))
    assert not contradicted("utf-16-le", "<p>中文</p>".encode("utf-16-le"))
    assert contradicted("iso8859-1", "Café".encode()) and contradicted("cp1250", "Café".encode())
    assert not contradicted("iso8859-1", "Café".encode("latin-1"))
    assert not contradicted("iso8859-1", b"plain ascii")
    assert not contradicted("gb18030", "长城".encode())  # a multi-byte charset: decoding decides


def test_a_declared_charset_the_bytes_contradict_gives_way_and_genuine_ones_are_kept(
        make_ctx, tmp_path):
    quoted = f"“{CAFE}”"
    ascii_page = page("The lighthouse", EN_ARTICLE, icp="ICP 1").encode()
    ascii_page += b" " * (len(ascii_page) % 2)  # an even length: all of it decodes as UTF-16
    w = Warc()
    w.response("http://ascii.example/", ascii_page, "text/html; charset=utf-16")
    w.response("http://utf8.example/", page("Café", CAFE, icp="ICP 1").encode(),
               "text/html; charset=iso-8859-1")
    # a genuine latin-1 page, its quotes in windows-1252 as pages labelled latin-1 are written
    w.response("http://latin1.example/", page("Café", quoted, icp="ICP 1").encode("cp1252"),
               "text/html; charset=iso-8859-1")
    w.response("http://utf16.example/", page("Café", CAFE).encode("utf-16"),
               "text/html; charset=utf-16")
    site = tmp_path / "site"
    site.mkdir()
    meta = page("Café", CAFE, icp="ICP 1").replace("<head>", "<head><meta charset='iso-8859-1'>")
    (site / "meta.html").write_bytes(meta.encode())
    kept, removed, _ = ingest(make_ctx, [w.save(tmp_path / "lies.warc.gz"), site / "meta.html"])
    assert removed == []
    by = {r["url"] or r["source"]: r for r in kept}
    assert EN_ARTICLE in by["http://ascii.example/"]["text"]
    assert by["http://ascii.example/"]["lang_id"] == "en"
    assert by["http://ascii.example/"]["charset"] in ("ascii", "utf-8")
    for key in ("http://utf8.example/", "meta"):
        assert CAFE in by[key]["text"] and by[key]["title"] == "Café"
        assert (by[key]["charset"], by[key]["lang_id"]) == ("utf-8", "fr")
    assert quoted in by["http://latin1.example/"]["text"]
    assert by["http://latin1.example/"]["charset"] == codecs.lookup("latin-1").name
    assert CAFE in by["http://utf16.example/"]["text"]
    assert by["http://utf16.example/"]["charset"] == "utf-16"
