"""CSV with a header row: a record per row, keyed by the header."""

from __future__ import annotations

import codecs
import csv
from pathlib import Path

from llmkit.data.io import BadRecord, open_binary


def read_csv(path: Path, cfg):
    with open_binary(path) as fb:
        f = codecs.getreader(cfg.encoding)(fb, errors="strict")
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            return
        except (csv.Error, UnicodeDecodeError) as e:
            yield f"{path}:1", BadRecord("malformed_csv", str(e))
            return
        while True:
            line = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except UnicodeDecodeError as e:
                yield f"{path}:{line}", BadRecord("invalid_utf8", str(e))
                return  # the decoder cannot resynchronise mid-stream
            except csv.Error as e:
                yield f"{path}:{line}", BadRecord("malformed_csv", str(e))
                continue
            if len(row) != len(header):
                yield f"{path}:{line}", BadRecord("malformed_csv", ",".join(row))
                continue
            yield f"{path}:{line}", dict(zip(header, row))
