"""JSON Lines (`.jsonl`, `.ndjson`: a record per line) and JSON (`.json`: one object or an array
of them)."""

from __future__ import annotations

import json
from pathlib import Path

from llmkit.data.charset import file_encoding, with_charset
from llmkit.data.io import BadRecord, decode_text, open_binary, read_jsonl


def read_jsonl_records(path: Path, cfg):
    encoding = file_encoding(path, cfg.encoding)
    for n, rec in read_jsonl(path, encoding=encoding, strict=False):
        yield f"{path}:{n}", with_charset(rec, encoding)


def read_json(path: Path, cfg):
    encoding = file_encoding(path, cfg.encoding)
    with open_binary(path) as f:
        text = decode_text(f.read(), encoding)
    if isinstance(text, BadRecord):
        yield f"{path}", text
        return
    try:
        data = json.loads(text)
    except ValueError as e:
        yield f"{path}:{getattr(e, 'lineno', 1)}", BadRecord("malformed_json", text)
        return
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        yield f"{path}", BadRecord("json_not_array", text)
        return
    for i, rec in enumerate(data):
        yield f"{path}[{i}]", with_charset(rec, encoding)
