import csv
import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from llmkit.data.ingest import IngestConfig, run_ingest
from llmkit.data.io import read_table
from llmkit.errors import UserError
from tests.conftest import write_jsonl


def ingest(make_ctx, paths, **cfg):
    ctx = make_ctx(force=True)
    b = run_ingest(ctx, [str(p) for p in paths], IngestConfig(**cfg))
    return read_table(b.final), read_table(b.final / "removed"), b.final


def test_jsonl_with_three_malformed_lines_quarantines_them_and_conserves_rows(make_ctx, tmp_path):
    p = write_jsonl(tmp_path / "docs.jsonl", [{"id": "a", "text": "one"}, {"text": "two"}],
                    raw_lines=[b'{"text": "unterminated', b"\xff\xfe not utf-8", b'{"text": 7}'])
    kept, removed, path = ingest(make_ctx, [p])
    assert kept.column("text").to_pylist() == ["one", "two"]
    assert kept.column("id").to_pylist()[0] == "a"
    assert kept.column("source").to_pylist() == ["docs", "docs"]
    assert sorted(removed.column("reason").to_pylist()) == [
        "invalid_utf8", "malformed_json", "non_string_text"]
    assert removed.column("location").to_pylist()[0] == "docs.jsonl:3"  # named below its folder
    stats = json.loads((path / "manifest.json").read_text())["stats"]
    assert stats["rows_in"] == 5 == stats["rows_out"] + stats["rows_removed"]
    assert stats["removed_by_reason"]["malformed_json"] == 1


def test_generated_ids_are_stable(make_ctx, tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [{"text": "x"}, {"text": "y"}])
    first = ingest(make_ctx, [p])[0].column("id").to_pylist()
    assert first == ingest(make_ctx, [p])[0].column("id").to_pylist()
    assert len(set(first)) == 2


def test_every_format_and_compression(make_ctx, tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "from jsonl"}])
    (tmp_path / "b.json").write_text(json.dumps([{"text": "from json"}]))
    (tmp_path / "c.txt").write_text("from txt\nsecond line")
    with open(tmp_path / "d.csv", "w", newline="") as f:
        csv.writer(f).writerows([["id", "text"], ["d1", "from csv"]])
    pq.write_table(pa.table({"text": ["from parquet"]}), tmp_path / "e.parquet")
    with gzip.open(tmp_path / "f.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "from gz"}) + "\n")
    (tmp_path / "g.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(json.dumps({"text": "from zst"}).encode() + b"\n"))
    kept, removed, _ = ingest(make_ctx, [tmp_path / "*"])
    assert sorted(kept.column("text").to_pylist()) == sorted([
        "from jsonl", "from json", "from txt\nsecond line", "from csv", "from parquet",
        "from gz", "from zst"])
    assert removed.num_rows == 0


def test_txt_per_line(make_ctx, tmp_path):
    (tmp_path / "p.txt").write_text("床前明月光\n\n疑是地上霜\n")
    kept, _, _ = ingest(make_ctx, [tmp_path / "p.txt"], per_line=True)
    assert kept.column("text").to_pylist() == ["床前明月光", "疑是地上霜"]


def test_broken_csv_rows_are_quarantined(make_ctx, tmp_path):
    (tmp_path / "x.csv").write_text('text,lang\nfine,en\n"broken,en,extra\nok,en\n')
    kept, removed, _ = ingest(make_ctx, [tmp_path / "x.csv"])
    assert "fine" in kept.column("text").to_pylist()
    assert removed.num_rows >= 1 and set(removed.column("reason").to_pylist()) == {"malformed_csv"}


def test_truncated_gzip_keeps_what_was_read(make_ctx, tmp_path):
    data = gzip.compress(b"".join(json.dumps({"text": f"doc {i}"}).encode() + b"\n"
                                  for i in range(2000)))
    (tmp_path / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    kept, removed, _ = ingest(make_ctx, [tmp_path / "t.jsonl.gz"])
    assert 0 < kept.num_rows < 2000
    assert removed.column("reason").to_pylist()[-1] == "truncated_file"


def test_binary_and_empty_files_leave_no_row_so_are_refused_unless_allowed(make_ctx, ws, tmp_path):
    (tmp_path / "bin.txt").write_bytes(b"\x00\x01\x02binary\x00")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    files = [tmp_path / "bin.txt", tmp_path / "empty.jsonl"]
    with pytest.raises(UserError, match=r"no row kept from 1 record of .*bin.txt.*: 1 × binary_file"):
        ingest(make_ctx, files)
    with pytest.raises(UserError, match=r"no records in .*empty.jsonl"):
        ingest(make_ctx, files[1:])
    assert not (ws / "raw").exists()
    kept, removed, _ = ingest(make_ctx, files, allow_empty=True)
    assert kept.num_rows == 0 and removed.column("reason").to_pylist() == ["binary_file"]


def test_a_missing_text_field_is_refused_naming_it_and_the_fields_records_have(make_ctx, ws,
                                                                               tmp_path):
    p = write_jsonl(tmp_path / "docs.jsonl", [{"id": str(i), "text": "words " * 20,
                                               "source": "web"} for i in range(120)])
    with pytest.raises(UserError) as e:
        ingest(make_ctx, [p], text_field="content")
    assert str(e.value).startswith(
        f"ingest: no row kept from 120 records of {p}: 120 × missing text field 'content' "
        f"(records have: id, text, source — did you mean --text-field text?) (first: {p}:1).")
    assert not (ws / "raw").exists()
    kept, removed, path = ingest(make_ctx, [p], text_field="content", allow_empty=True)
    stats = json.loads((path / "manifest.json").read_text())["stats"]
    assert (kept.num_rows, removed.num_rows, stats["removed_by_reason"]) == (
        0, 120, {"missing_content": 120})


def test_allow_empty_is_a_setting(tmp_path):
    from typer.testing import CliRunner

    from llmkit.cli.app import build_app

    p = write_jsonl(tmp_path / "docs.jsonl", [{"body": "words"}])
    args = ["ingest", str(p), "-w", str(tmp_path / "ws")]
    r = CliRunner().invoke(build_app(), args)
    assert r.exit_code == 2 and "--text-field body" in r.output and "Traceback" not in r.output
    assert CliRunner().invoke(build_app(), args + ["--set", "allow_empty=true"]).exit_code == 0


def test_a_record_lost_after_it_was_read_is_a_bug_not_a_smaller_output(make_ctx, tmp_path,
                                                                       monkeypatch):
    import llmkit.data.ingest as ingest_module

    real = ingest_module.normalise
    monkeypatch.setattr(ingest_module, "normalise",
                        lambda rec, cfg: [] if rec.get("text") == "b" else real(rec, cfg))
    p = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}, {"text": "b"}])
    with pytest.raises(AssertionError, match="2 records read"):
        ingest(make_ctx, [p])


def test_text_rows_get_a_lang_label_from_the_script_unless_they_have_one(make_ctx, tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [
        {"text": "床前明月光，疑是地上霜。"}, {"text": "The moon before my bed."},
        {"text": "Лунный свет"}, {"text": "12345 !!!"}, {"text": "Bonjour", "lang": "fr"}])
    kept, _, _ = ingest(make_ctx, [p])
    assert kept.column("lang").to_pylist() == ["zh", "latin", "other", "other", "fr"]


def test_gb18030_input_is_reported_then_read_with_the_encoding(make_ctx, tmp_path, capsys):
    (tmp_path / "gbk.txt").write_bytes("春眠不觉晓，处处闻啼鸟。".encode("gb18030"))
    (tmp_path / "utf8.txt").write_text("a real document")
    with pytest.raises(UserError, match="1 × invalid_utf8 .*--set encoding=gb18030"):
        ingest(make_ctx, [tmp_path / "gbk.txt"], encoding="utf-8")
    _, removed, _ = ingest(make_ctx, [tmp_path / "gbk.txt", tmp_path / "utf8.txt"],
                           encoding="utf-8")
    assert removed.column("reason").to_pylist() == ["invalid_utf8"]
    assert "gb18030" in capsys.readouterr().out
    for encoding in ("gb18030", "auto"):  # named, or detected (the default)
        kept, _, _ = ingest(make_ctx, [tmp_path / "gbk.txt"], encoding=encoding)
        assert kept.column("text").to_pylist() == ["春眠不觉晓，处处闻啼鸟。"]


def test_extra_fields_are_carried_even_when_they_appear_late(make_ctx, tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}, {"text": "b", "tag": "x", "n": 3}])
    kept, _, _ = ingest(make_ctx, [p], batch_rows=1)
    assert kept.column("tag").to_pylist() == [None, "x"]
    assert kept.column("n").to_pylist() == [None, "3"]


def test_sft_kind_maps_instruction_response_and_messages(make_ctx, tmp_path):
    p = write_jsonl(tmp_path / "s.jsonl", [
        {"instruction": "Add", "input": "1+1", "response": "2"},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {"prompt": "no answer"},
    ])
    kept, removed, _ = ingest(make_ctx, [p], kind="sft")
    assert kept.column("prompt").to_pylist()[0] == "Add\n\n1+1"
    assert kept.column("response").to_pylist()[0] == "2"
    assert kept.column("messages").to_pylist()[1][1] == {"role": "assistant", "content": "yo"}
    assert removed.column("reason").to_pylist() == ["missing_response"]


def test_ranked_preferences_expand_to_all_pairs(make_ctx, tmp_path):
    p = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Q", "responses": ["A2", "A1", "A3"]},
                                           {"prompt": "Q2", "chosen": "good", "rejected": "bad"}])
    kept, _, path = ingest(make_ctx, [p], kind="preference")
    pairs = list(zip(kept.column("chosen").to_pylist(), kept.column("rejected").to_pylist()))
    assert pairs == [("A2", "A1"), ("A2", "A3"), ("A1", "A3"), ("good", "bad")]
    stats = json.loads((path / "manifest.json").read_text())["stats"]
    assert (stats["records_in"], stats["rows_in"], stats["rows_out"]) == (2, 4, 4)


def test_a_pair_with_the_same_reply_on_both_sides_is_quarantined_with_its_reason(make_ctx, tmp_path):
    p = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Q", "chosen": "same", "rejected": "same "},
                                           {"prompt": "Q2", "responses": ["A1", "A2", "A1"]},
                                           {"prompt": "Q3", "chosen": "good", "rejected": "bad"}])
    kept, removed, _ = ingest(make_ctx, [p], kind="preference")
    assert list(zip(kept.column("chosen").to_pylist(), kept.column("rejected").to_pylist())) == [("good", "bad")]
    assert removed.column("reason").to_pylist() == ["chosen_equals_rejected", "repeated_response"]
    # unpaired for KTO, the same reply would be labelled desirable and undesirable at once
    kept, removed, _ = ingest(make_ctx, [p], kind="feedback")
    assert kept.column("completion").to_pylist() == ["good", "bad"]
    assert removed.column("reason").to_pylist() == ["chosen_equals_rejected", "repeated_response"]


def test_missing_input_is_a_user_error(make_ctx, tmp_path):
    with pytest.raises(UserError, match="no file matches"):
        run_ingest(make_ctx(), [str(tmp_path / "nope*.jsonl")], IngestConfig())
