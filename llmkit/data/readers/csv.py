"""CSV with a header row: a record per row, keyed by the header."""

from __future__ import annotations

import codecs
import csv
from pathlib import Path

from llmkit.data.charset import file_encoding, invalid_text, with_charset
from llmkit.data.io import BadRecord, open_binary


def read_csv(path: Path, cfg):
    encoding = file_encoding(path, cfg.encoding)
    with open_binary(path) as fb:
        f = codecs.getreader(encoding)(fb, errors="strict")
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
                yield f"{path}:{line}", BadRecord(invalid_text(encoding), str(e))
                return  # the decoder cannot resynchronise mid-stream
            except csv.Error as e:
                yield f"{path}:{line}", BadRecord("malformed_csv", str(e))
                continue
            if len(row) != len(header):
                yield f"{path}:{line}", BadRecord("malformed_csv", ",".join(row))
                continue
            yield f"{path}:{line}", with_charset(dict(zip(header, row)), encoding)
