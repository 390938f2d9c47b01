"""Plain text (`.txt`, `.text`, `.md`): a document per file, or per line with `per_line`."""

from __future__ import annotations

from pathlib import Path

from llmkit.data.charset import file_encoding, with_charset
from llmkit.data.io import BadRecord, decode_text, open_binary


def read_txt(path: Path, cfg):
    encoding = file_encoding(path, cfg.encoding)
    if cfg.per_line:
        with open_binary(path) as f:
            for n, line in enumerate(f, 1):
                text = decode_text(line, encoding)
                if isinstance(text, BadRecord) or text.strip():
                    yield f"{path}:{n}", text if isinstance(text, BadRecord) else with_charset(
                        {cfg.text_field: text.rstrip("\r\n")}, encoding)
        return
    with open_binary(path) as f:
        data = f.read()
    if b"\x00" in data[:8192]:
        yield str(path), BadRecord("binary_file", data[:200].decode("latin-1"))
        return
    text = decode_text(data, encoding)
    yield str(path), text if isinstance(text, BadRecord) else with_charset(
        {cfg.text_field: text}, encoding)
