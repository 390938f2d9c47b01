"""`llmkit ingest`: jsonl / json / txt / csv / parquet / warc / html (optionally .gz / .zst) -> dataset `raw`.

Records are read as a stream by their format's reader (`llmkit.data.readers`) and normalised
to the schema of their kind:
- text:       id, text, source, lang (+ other fields carried as columns); `lang` is the
              record's own, else zh / latin / other from the script (`language_of`).
              Web pages (warc: WARC/WET, html) add url, domain, date, charset, title, and
              lang_id, lang_score, script from a language model (`llmkit.data.langid`);
              `lang_id=true` adds those three to the rows of every format
- sft:        id, prompt, response | messages, text, source
- preference: id, prompt, chosen, rejected, text, source (a ranked `responses` list, best
              first, expands to every ordered pair); a pair whose chosen and rejected reply
              are the same text, or a list that names one reply twice, is quarantined
- prompt:     id, prompt, text, source (+ e.g. `answer` carried)
- feedback:   id, prompt | messages (the conversation, ending in the completion), completion,
              label (bool), text, source (+ e.g. `answer` carried); a paired record (`chosen`,
              `rejected`) becomes two rows, chosen true and rejected false (TRL's unpairing); a
              ranked `responses` list its best reply true and each other one false
A record that cannot be read or normalised is quarantined in `removed/` with its `reason` and
`location` (file:line); it never stops the run. Records are counted as they are read, and
that count must equal the rows written plus the rows quarantined. An output without rows is
refused (exit 2, the reasons named) unless `allow_empty`.

The files are read in consecutive groups of `task_bytes` (`file_groups`), one task each
(`IngestTasks`: its own parts and counts, sealed in the work area), and the artifact is the
tasks' parts in order: the same for any --workers, --rank/--world-size split or executor.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmkit.data.charset import check_encoding
from llmkit.data.chat import shape_hint
from llmkit.data.driver import (Assembled, DataConfig, DataStage, Phase, SealedTasks,
                                run_data_stage)
from llmkit.data.io import MAX_REMOVED_TEXT, BadRecord, DatasetWriter
from llmkit.data.langid import language_columns
from llmkit.data.pipeline import link_task_outputs
from llmkit.data.readers import COMPRESSIONS, FORMATS, expand_inputs, format_of, read_records
from llmkit.data.record_kinds import normalise
from llmkit.errors import ConfigError
from llmkit.core.workspace import Artifact
from llmkit.core.durable import kill_point


@dataclass
class IngestConfig(DataConfig):
    kind: Literal["text", "sft", "preference", "prompt", "feedback"] = "text"  # schema of the records
    text_field: str = "text"        # field holding the document (kind=text)
    id_field: str = "id"            # field holding the id; generated stably when absent
    source: str | None = None       # value of `source`; default: the file's stem
    per_line: bool = False          # txt: one document per line instead of per file
    format: str | None = None       # force a format instead of guessing from the extension
    encoding: str = "auto"          # text files' encoding: auto (detected per file: llmkit.data.charset) or a codec
    batch_rows: int = 4096          # rows per written batch (memory stays at one batch)
    task_bytes: int = 256 << 20     # file bytes per task: files are grouped in order up to this
    lang_id: bool = False           # identify every text row's language (web pages always are)
    max_page_bytes: int = 8 << 20   # web pages larger than this are quarantined (page_too_large)
    extract_timeout_s: float = 10.0  # a page whose main text takes longer is quarantined (extraction_timeout); 0: no limit
    max_nesting_depth: int = 256    # a page whose elements nest deeper is quarantined (nesting_too_deep): libxml2's limit

    def __post_init__(self):
        if self.format is not None and self.format not in FORMATS:
            raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if check_encoding(self.encoding):
            raise ConfigError(check_encoding(self.encoding))
        if self.extract_timeout_s < 0:
            raise ConfigError(f"extract_timeout_s must be ≥ 0, got {self.extract_timeout_s}")
        if min(self.batch_rows, self.task_bytes, self.max_page_bytes, self.max_nesting_depth) < 1:
            raise ConfigError(f"batch_rows, task_bytes, max_page_bytes and max_nesting_depth must "
                              f"be ≥ 1, got {self.batch_rows}, {self.task_bytes}, "
                              f"{self.max_page_bytes}, {self.max_nesting_depth}")


def _stem(path: Path) -> str:
    name = path.name
    for c in COMPRESSIONS:
        name = name.removesuffix(c)
    return name.rsplit(".", 1)[0] if "." in name else name


WEB_FORMATS = ("warc", "html")  # whose rows always get a language identified


# -- the stage ------------------------------------------------------------------------------

def file_fingerprint(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:32]


def _generated_id(name: str, n: int) -> str:
    return hashlib.blake2b(f"{name}:{n}".encode(), digest_size=8).hexdigest()


def input_names(files: list[Path], cwd: Path) -> dict[str, str]:
    """Each input file (as typed) named below the folder that holds them all, as datatrove names
    a document below its data folder: what generated ids and removed rows' locations say, so the
    same files give the same rows wherever they lie, whatever the path typed."""
    full = [os.path.abspath(Path(cwd, f)) for f in files]
    base = os.path.commonpath([os.path.dirname(f) for f in full]) if full else ""
    return {str(f): Path(os.path.relpath(p, base)).as_posix() for f, p in zip(files, full)}


def file_groups(files: list[Path], task_bytes: int) -> list[list[Path]]:
    """The files in order, in consecutive groups of at least `task_bytes` on disk (the last may
    be less): an ingest task each. A file is never split (a .gz stream has no middle)."""
    groups, group, size = [], [], 0
    for f in files:
        group.append(f)
        size += f.stat().st_size
        if size >= task_bytes:
            groups.append(group)
            group, size = [], 0
    return groups + [group] if group else groups


@dataclass(frozen=True)
class IngestTasks(SealedTasks):
    """Task K reads file group K into `root/part-K/` (kept/, removed/); its marker holds what
    it counted (`read_group`). Relative paths are read from the driver's directory `cwd`;
    `names`: what rows call each file (`input_names`)."""
    root: Path
    groups: list
    cfg: IngestConfig
    cwd: Path
    names: dict

    def __len__(self) -> int:
        return len(self.groups)

    def build(self, k: int, tmp: Path) -> dict:
        return read_group(self.groups[k], self.cfg, DatasetWriter(tmp / "kept"),
                          DatasetWriter(tmp / "removed"), self.cwd, self.names)


def read_group(files: list[Path], cfg: IngestConfig, kept_w, removed_w, cwd: Path,
               names: dict[str, str]) -> dict:
    """Read, normalise and write the records of `files` (relative ones read from `cwd`, named
    in rows by `names`); what was counted, as a task's marker records it (conservation checked
    here)."""
    reasons: Counter = Counter()
    per_source: Counter = Counter()
    # fields of the records without the text field, with the characters of their strings
    fields_seen: Counter = Counter()
    records = extra_rows = 0
    first_removed = None
    kept, removed = _Buffer(kept_w, cfg.batch_rows), _Buffer(removed_w, cfg.batch_rows)
    for path in files:
        source = cfg.source or _stem(path)
        opened, name = Path(cwd, path), names[str(path)]  # read anywhere, named the same anywhere
        identify = cfg.kind == "text" and (cfg.lang_id or format_of(opened, cfg.format)
                                           in WEB_FORMATS)
        for n, (loc, rec) in enumerate(read_records(opened, cfg)):
            at = loc[len(str(opened)):]  # the line, record or byte offset in the file
            loc = name + at
            records += 1  # counted as read; checked below against what was written
            kill_point("ingest:record")
            rid = rec.get(cfg.id_field) if isinstance(rec, dict) else None
            rid = str(rid) if rid not in (None, "") else _generated_id(name, n)
            rows = rec if isinstance(rec, BadRecord) else normalise(rec, cfg)
            if isinstance(rows, (BadRecord, str)):
                reason = rows.reason if isinstance(rows, BadRecord) else rows
                raw = rows.raw if isinstance(rows, BadRecord) else json.dumps(
                    rec, ensure_ascii=False, default=str)
                removed.add({"id": rid, "text": raw[:MAX_REMOVED_TEXT], "source": source,
                             "reason": reason, "location": loc})
                reasons[reason] += 1
                first_removed = first_removed or str(path) + at  # a message: as typed
                if cfg.kind == "text" and reason == f"missing_{cfg.text_field}":
                    fields_seen.update({k: len(v) if isinstance(v, str)
                                        and k != cfg.id_field else 0
                                        for k, v in rec.items()})
                continue
            # a ranked preference record becomes several pairs; one that became no
            # row at all still counts one, so the check below catches it
            extra_rows += max(len(rows) - 1, 0)
            for i, row in enumerate(rows):
                row_id = rid if len(rows) == 1 else f"{rid}-{i}"
                if identify and "lang_id" not in row:
                    row.update(language_columns(row["text"]))
                kept.add({"id": row_id, **row, "source": row.get("source") or source})
                per_source[source] += 1
    rows_out, rows_removed = kept.close(), removed.close()
    if records + extra_rows != rows_out + rows_removed:  # a bug, never a user error
        raise AssertionError(f"ingest: {records} records read (+ {extra_rows} from ranked "
                             f"lists), {rows_out} + {rows_removed} rows written")
    return {"records": records, "extra_rows": extra_rows, "rows_out": rows_out,
            "rows_removed": rows_removed, "reasons": reasons, "per_source": per_source,
            "fields_seen": fields_seen, "first_removed": first_removed}


def run_ingest(ctx, patterns: list[str], cfg: IngestConfig):
    """Run (or resume) ingest as one task per file group (`IngestTasks`); its Builder, or None
    for a --rank run."""
    files = expand_inputs(patterns)
    groups = file_groups(files, cfg.task_bytes)
    cwd = Path.cwd()  # relative paths are read from here, wherever a task runs
    names = input_names(files, cwd)
    return run_data_stage(ctx, DataStage(
        "ingest", cfg, [Artifact(f, {"fingerprint": file_fingerprint(f)}) for f in files], "raw",
        [Phase("files", len(groups), lambda work: IngestTasks(work.dir / "files", groups, cfg, cwd,
                                                                names),
               spread=True)],
        lambda out, done: assemble(out, done["files"], cfg, len(files)),
        source=_named(files), unit="records"))


def assemble(out_dir: Path, tasks: IngestTasks, cfg: IngestConfig, n_files: int) -> Assembled:
    """Link the tasks' parts into the dataset `out_dir`; their counts summed."""
    infos = [tasks.info(k) for k in range(len(tasks))]
    link_task_outputs([tasks.folder(k) for k in range(len(tasks))], out_dir, "ingest")
    total = {key: Counter() for key in ("reasons", "per_source", "fields_seen")}
    for info in infos:
        for key, counter in total.items():
            counter.update(info[key])  # update, not +: a field's count may be 0
    records = sum(i["records"] for i in infos)
    stats = dict(records_in=records, rows_in=records + sum(i["extra_rows"] for i in infos),
                 rows_out=sum(i["rows_out"] for i in infos),
                 rows_removed=sum(i["rows_removed"] for i in infos),
                 removed_by_reason=dict(sorted(total["reasons"].items())),
                 files=n_files, rows_by_source=dict(sorted(total["per_source"].items())))
    if cfg.encoding in ("auto", "utf-8") and total["reasons"].get("invalid_utf8"):
        print("warning: some records are not valid UTF-8; if the files are GBK/GB18030, "
              "re-run with --set encoding=gb18030", flush=True)
    return Assembled(stats, next((i["first_removed"] for i in infos if i["first_removed"]), None),
                     {**shape_hint(cfg.kind, total["reasons"]),
                      f"missing_{cfg.text_field}": _missing_field(cfg, total["fields_seen"]),
                      "invalid_utf8": "invalid_utf8 (GBK/GB18030 files: --set encoding=gb18030)"})


def _named(files: list[Path]) -> str:
    """The input files as an error message names them: all of a few, else the count."""
    if len(files) <= 3:
        return ", ".join(map(str, files))
    return f"{len(files)} files ({', '.join(f.name for f in files[:3])}, …)"


def _missing_field(cfg: IngestConfig, fields_seen: Counter) -> str:
    """A missing text field in words: the fields the records have, and the likeliest one (the
    closest name, else the one holding the most text)."""
    what = f"missing text field {cfg.text_field!r}"
    if not fields_seen:
        return what
    likely = difflib.get_close_matches(cfg.text_field, list(fields_seen), n=1) or [
        f for f, chars in fields_seen.most_common(1) if chars]
    hint = f" — did you mean --text-field {likely[0]}?" if likely else ""
    have = ", ".join(list(fields_seen)[:10]) + (", …" if len(fields_seen) > 10 else "")
    return f"{what} (records have: {have}{hint})"


class _Buffer:
    """Collects row dicts and writes them as one table per `size` rows."""

    def __init__(self, writer, size: int):
        self.writer, self.size, self.rows = writer, size, []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.size:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if self.rows:
            self.writer.write(pa.Table.from_pylist(_uniform(self.rows)))
            self.rows = []

    def close(self) -> int:
        self.flush()
        return self.writer.close()


def _uniform(rows: list[dict]) -> list[dict]:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k) for k in keys} for r in rows]
