"""The judgement journal: one JSON line per judgement, appended and fsynced before the rater's
page is told it is saved, so a judgement the page confirmed survives a kill -9 or a power cut.

A judgement's id is derived from (rater, item): a request repeated after a lost answer, or the
same item judged in a second tab, finds the id in the journal and is answered with the first
judgement instead of being written twice. A process killed in the middle of an append leaves a
last line without its newline; that judgement was never confirmed, and reopening the journal
cuts it off so that the next append starts on a line of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

from llmkit.errors import UserError
from llmkit.workspace import _fsync_dir, kill_point

JOURNAL_FILE = "journal.jsonl"
CHOICES = ("left", "right", "tie", "skip")


def judgement_id(rater: str, item: str) -> str:
    return hashlib.blake2b(f"{rater}\0{item}".encode(), digest_size=8).hexdigest()


def read_journal(path: Path) -> list[dict]:
    """The complete judgements of a journal (a torn last line is left out), in the order they
    were written."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    return _parse(path, data[:data.rfind(b"\n") + 1])


def _parse(path: Path, data: bytes) -> list[dict]:
    records = []
    for n, line in enumerate(data.splitlines(), 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            raise UserError(f"{path}:{n} is not a JSON judgement; the journal was edited by hand? "
                            "Remove or repair that line") from None
    return records


class Journal:
    """The journal of one session, open for appending (thread-safe)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._drop_torn_tail()
        self.records = {r["id"]: r for r in read_journal(self.path)}
        self._done: dict[str, set[str]] = {}
        for r in self.records.values():
            self._done.setdefault(r["rater"], set()).add(r["item"])
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fsync_dir(self.path.parent)  # the file's own name survives a crash too

    def _drop_torn_tail(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        whole = data.rfind(b"\n") + 1
        if whole < len(data):
            os.truncate(self.path, whole)

    def judged_by(self, rater: str) -> frozenset[str]:
        """The items `rater` judged (a copy: appends in other threads do not change it)."""
        with self._lock:
            return frozenset(self._done.get(rater, ()))

    def append(self, record: dict) -> tuple[dict, bool]:
        """(the judgement now on disk, whether it was there already). `record` needs `rater`,
        `item` and `choice`; its id and time are added here."""
        record = {"id": judgement_id(record["rater"], record["item"]), **record,
                  "time": round(time.time(), 3)}
        with self._lock:
            if record["id"] in self.records:
                return self.records[record["id"]], True
            line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
            kill_point("journal_write")
            written = 0
            while written < len(line):
                written += os.write(self._fd, line[written:])
            os.fsync(self._fd)
            kill_point("journal_synced")
            self.records[record["id"]] = record
            self._done.setdefault(record["rater"], set()).add(record["item"])
        return record, False

    def close(self) -> None:
        os.close(self._fd)
