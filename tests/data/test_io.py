import gzip
import json

import pytest

from llmkit.data.io import BadRecord, read_jsonl
from llmkit.errors import UserError
from tests.conftest import write_jsonl


def test_jsonl_records_come_with_their_line_numbers(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n\n  \n" + json.dumps([2]) + "\n")
    assert list(read_jsonl(path)) == [(1, {"a": 1}), (4, [2])]
    gz = tmp_path / "r.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert list(read_jsonl(gz)) == [(1, {"a": 1}), (4, [2])]


def test_a_bad_line_is_an_error_naming_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"a": 1}], raw_lines=[b'{"a": '])
    with pytest.raises(UserError, match=r"r\.jsonl:2: not valid JSON"):
        list(read_jsonl(path))
    path = write_jsonl(tmp_path / "r.jsonl", [{"a": 1}], raw_lines=[b"\xff\xfe"])
    with pytest.raises(UserError, match=r"r\.jsonl:2: not valid utf-8 text"):
        list(read_jsonl(path))


def test_not_strict_yields_bad_lines_with_their_reason(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"a": 1}], raw_lines=[b'{"a": ', b"\xff\xfe"])
    (_, ok), (n2, bad_json), (n3, bad_text) = read_jsonl(path, strict=False)
    assert ok == {"a": 1}
    assert (n2, bad_json.reason, bad_json.raw.strip()) == (2, "malformed_json", '{"a":')
    assert (n3, bad_text.reason) == (3, "invalid_utf8") and isinstance(bad_text, BadRecord)
