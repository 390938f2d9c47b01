"""Ingest's readers, one module per format, each also reading its `.gz` / `.zst` variant. A
reader takes (path, cfg: the IngestConfig) and yields (location, record dict) or (location,
BadRecord) for a record that cannot be read, so that ingest quarantines it and goes on.

A new format is a module here with its reader, a row in `READERS` and its file suffixes in
`SUFFIXES` (tests/data/test_readers.py checks that every module is in the table).
"""

from __future__ import annotations

import glob
from pathlib import Path

from llmkit.data.io import BadRecord
from llmkit.data.readers.csv import read_csv
from llmkit.data.readers.html import read_html
from llmkit.data.readers.jsonl import read_json, read_jsonl_records
from llmkit.data.readers.parquet import read_parquet
from llmkit.data.readers.txt import read_txt
from llmkit.data.readers.warc import read_warc
from llmkit.errors import UserError

READERS = {"jsonl": read_jsonl_records, "json": read_json, "txt": read_txt, "csv": read_csv,
           "parquet": read_parquet, "warc": read_warc, "html": read_html}
FORMATS = tuple(READERS)  # what `format=` may force
SUFFIXES = {"jsonl": "jsonl", "ndjson": "jsonl", "json": "json", "txt": "txt", "text": "txt",
            "md": "txt", "csv": "csv", "parquet": "parquet", "warc": "warc", "wet": "warc",
            "html": "html", "htm": "html"}  # file suffix -> format
COMPRESSIONS = (".gz", ".zst")


def expand_inputs(patterns: list[str]) -> list[Path]:
    files: list[Path] = []
    for pat in patterns:
        matches = sorted(glob.glob(pat, recursive=True)) or ([pat] if Path(pat).exists() else [])
        if not matches:
            raise UserError(f"ingest: no file matches {pat!r}")
        for m in map(Path, matches):
            if m.is_dir():
                files += sorted(p for p in m.rglob("*") if p.is_file() and format_of(p, None))
            else:
                files.append(m)
    seen = set()
    return [f for f in files if not (f in seen or seen.add(f))]


def format_of(path: Path, forced: str | None) -> str | None:
    """The format `forced`, else the one the file's suffix (under a compression suffix) names."""
    if forced:
        return forced
    name = path.name.lower()
    for c in COMPRESSIONS:
        name = name.removesuffix(c)
    ext = name.rsplit(".", 1)[-1] if "." in name else ""
    return SUFFIXES.get(ext)


def read_records(path: Path, cfg):
    """The records of one file, read by its format's reader; a truncated compressed file ends
    in one `truncated_file` BadRecord after what could be read."""
    fmt = format_of(path, cfg.format)
    if fmt is None:
        raise UserError(f"{path}: unknown format; use one of {', '.join(FORMATS)} "
                        "(optionally .gz/.zst) or --set format=…")
    try:
        yield from READERS[fmt](path, cfg)
    except (EOFError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise UserError(f"{path}: cannot read ({e})") from None
        # a truncated .gz/.zst: keep what was read, quarantine the rest as one row
        yield f"{path}:end", BadRecord("truncated_file", str(e))
    except Exception as e:
        if type(e).__name__ == "ZstdError":
            yield f"{path}:end", BadRecord("truncated_file", str(e))
        else:
            raise
