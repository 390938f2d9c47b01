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
from llmkit.cjk import language_of
from llmkit.data.chat import shape_hint
from llmkit.data.driver import (Assembled, DataConfig, DataStage, Phase, SealedTasks,
                                run_data_stage)
from llmkit.data.io import MAX_REMOVED_TEXT, BadRecord, DatasetWriter
from llmkit.data.langid import language_columns
from llmkit.data.pipeline import link_task_outputs
from llmkit.data.readers import COMPRESSIONS, FORMATS, expand_inputs, format_of, read_records
from llmkit.errors import ConfigError
from llmkit.workspace import Artifact, kill_point


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


# -- normalising records to the schema of a kind ---------------------------------------------

def _text(value) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _missing(rec: dict, key: str) -> str:
    if key not in rec or rec[key] is None:
        return f"missing_{key}"
    if isinstance(rec[key], str):
        return f"empty_{key}"
    return f"non_string_{key}"


def normalise(rec, cfg: IngestConfig) -> list[dict] | str:
    """A record as rows of `cfg.kind`'s schema, or the reason it has none."""
    if not isinstance(rec, dict):
        return "record_not_object"
    if cfg.kind == "text":
        text = _text(rec.get(cfg.text_field))
        if text is None:
            return _missing(rec, cfg.text_field)
        extra = {k: _carry(v) for k, v in rec.items() if k not in (cfg.text_field, cfg.id_field)}
        if not extra.get("lang"):  # a record's own label wins
            extra["lang"] = language_of(text)
        return [{"text": text, **extra}]
    if cfg.kind == "sft":
        return _sft_row(rec)
    if cfg.kind == "preference":
        return _preference_rows(rec)
    if cfg.kind == "feedback":
        return _feedback_rows(rec)
    prompt = _text(rec.get("prompt")) or _text(rec.get("instruction"))
    if prompt is None:
        return _missing(rec, "prompt")
    extra = {k: _carry(v) for k, v in rec.items() if k not in ("prompt", "instruction", "id")}
    return [{"prompt": prompt, "text": prompt, **extra}]


def _carry(value):
    """Extra fields become string columns, so batches from different files share a schema."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _sft_row(rec: dict) -> list[dict] | str:
    if "messages" in rec:
        msgs = rec["messages"]
        if not (isinstance(msgs, list) and msgs and all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in msgs)):
            return "malformed_messages"
        if not any(m["role"] == "assistant" for m in msgs):
            return "no_assistant_turn"
        msgs = [{"role": m["role"], "content": m["content"]} for m in msgs]
        text = "\n".join(m["content"] for m in msgs)
        return [{"messages": msgs, "prompt": None, "response": None, "text": text}]
    prompt = _text(rec.get("prompt")) or _text(rec.get("instruction"))
    if prompt is None:
        return _missing(rec, "instruction" if "instruction" in rec else "prompt")
    if _text(rec.get("input")):
        prompt = f"{prompt}\n\n{rec['input']}"
    response = _text(rec.get("response")) or _text(rec.get("output"))
    if response is None:
        return _missing(rec, "response")
    return [{"messages": None, "prompt": prompt, "response": response,
             "text": f"{prompt}\n{response}"}]


def _preference_rows(rec: dict) -> list[dict] | str:
    prompt = _text(rec.get("prompt"))
    if prompt is None:
        return _missing(rec, "prompt")
    if "responses" in rec:  # ranked best first: every ordered pair is a preference
        ranked = rec["responses"]
        if not (isinstance(ranked, list) and len(ranked) >= 2 and all(map(_text, ranked))):
            return "malformed_responses"
        pairs = [(ranked[i], ranked[j]) for i in range(len(ranked))
                 for j in range(i + 1, len(ranked))]
    else:
        chosen, rejected = _text(rec.get("chosen")), _text(rec.get("rejected"))
        if chosen is None:
            return _missing(rec, "chosen")
        if rejected is None:
            return _missing(rec, "rejected")
        pairs = [(chosen, rejected)]
    if any(c.strip() == r.strip() for c, r in pairs):  # nothing to prefer: a zero gradient
        return "repeated_response" if "responses" in rec else "chosen_equals_rejected"
    return [{"prompt": prompt, "chosen": c, "rejected": r, "text": f"{prompt}\n{c}"}
            for c, r in pairs]


FEEDBACK_FIELDS = ("id", "prompt", "completion", "label", "messages", "chosen", "rejected")
LABELS = {"true": True, "false": False, "1": True, "0": False}


def _label(value) -> bool | None:
    """true/false as JSON writes them, 1/0, or their text (a CSV column)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return LABELS.get(value.strip().lower()) if isinstance(value, str) else None


def _messages(value) -> list[dict] | None:
    if isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    return None


def _feedback_rows(rec: dict) -> list[dict] | str:
    """Rows of (prompt turns, completion, label): TRL's unpaired preference records (prompt and
    completion as text or messages), `messages` + label, or a pair unpaired."""
    extra = {k: _carry(v) for k, v in rec.items() if k not in FEEDBACK_FIELDS}
    if ("chosen" in rec and "rejected" in rec or "responses" in rec) and "label" not in rec:
        pairs = _preference_rows(rec)
        if isinstance(pairs, str):
            return pairs
        # a ranked list: its best reply desirable, every other one ranked below it undesirable
        ranked = [pairs[0]["chosen"], *(p["rejected"] for p in pairs if p["chosen"] == pairs[0]["chosen"])]
        prompt = [{"role": "user", "content": pairs[0]["prompt"]}]
        return [_feedback_row(prompt, reply, k == 0, extra) for k, reply in enumerate(ranked)]
    if "label" not in rec or rec["label"] is None:
        return "missing_label"
    label = _label(rec["label"])
    if label is None:
        return "invalid_label"
    if "messages" in rec and "completion" not in rec:
        msgs = _messages(rec["messages"])
        if msgs is None:
            return "malformed_messages"
        if msgs[-1]["role"] != "assistant":
            return "no_assistant_turn"
        if len(msgs) == 1:
            return "missing_prompt"
        return [_feedback_row(msgs[:-1], msgs[-1]["content"], label, extra)]
    prompt = _messages(rec.get("prompt")) or (
        [{"role": "user", "content": rec["prompt"]}] if _text(rec.get("prompt")) else None)
    if prompt is None:
        return "malformed_messages" if isinstance(rec.get("prompt"), list) else _missing(rec, "prompt")
    completion = rec.get("completion")
    if isinstance(completion, list):  # TRL's conversational form: one assistant message
        turns = _messages(completion)
        if not turns or len(turns) != 1 or turns[0]["role"] != "assistant":
            return "malformed_messages"
        completion = turns[0]["content"]
    if _text(completion) is None:
        return _missing(rec, "completion")
    return [_feedback_row(prompt, completion, label, extra)]


def _feedback_row(prompt: list[dict], completion: str, label: bool, extra: dict) -> dict:
    """A single user turn is stored as `prompt`; a longer conversation as `messages`, the
    completion its last turn (what `llmkit.data.chat.prompt_messages` reads back)."""
    single = len(prompt) == 1 and prompt[0]["role"] == "user"
    return {"prompt": prompt[0]["content"] if single else None,
            "messages": None if single else [*prompt, {"role": "assistant", "content": completion}],
            "completion": completion, "label": label,
            "text": "\n".join([*(m["content"] for m in prompt), completion]), **extra}


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
