"""The judgement journal: one JSON line per judgement, appended and fsynced before the rater's
page is told it is saved, so a judgement the page confirmed survives a kill -9 or a power cut.

One judgement per rater and item, the first: a judgement's id is derived from (rater, item), and
a request repeated after a lost answer, or the same item judged again in a second tab (even with
another choice), finds the id in the journal and is answered with the first judgement instead of
being written twice. A journal has one writer at a time: `Journal` holds `journal.lock` (an
flock, which the kernel drops when its process dies) while it is open, so a second server on the
same session is refused instead of recording every item a second time (`writer_of` names the
holder). A journal written before that rule may hold repeats: readers keep the first line of each
rater and item (`first_judgements`). A process killed in the middle of an append leaves a last
line without its newline; that judgement was never confirmed, and reopening the journal cuts it
off so that the next append starts on a line of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from pathlib import Path

from llmkit.errors import UserError
from llmkit.core.durable import _fsync_dir, kill_point

JOURNAL_FILE = "journal.jsonl"
LOCK_FILE = "journal.lock"  # beside the journal: flocked by the one process that writes it
CHOICES = ("left", "right", "tie", "skip")


def judgement_id(rater: str, item: str) -> str:
    return hashlib.blake2b(f"{rater}\0{item}".encode(), digest_size=8).hexdigest()


def read_journal(path: Path) -> list[dict]:
    """The complete judgements of a journal (a torn last line is left out), in the order they
    were written, repeats included (`first_judgements` leaves them out)."""
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


def first_judgements(records: list[dict]) -> tuple[list[dict], int]:
    """(the first judgement of each rater and item, in the journal's order; how many later ones
    were left out). A later line for the same rater and item repeats a judgement that rater was
    already told was saved, so the first one stands, whatever the later one chose."""
    seen, first = set(), []
    for record in records:
        key = (record.get("rater"), record.get("item"))
        if key not in seen:
            seen.add(key)
            first.append(record)
    return first, len(records) - len(first)


def writer_of(journal: Path) -> dict | None:
    """Who holds `journal` open for writing ({pid, host, since} and a server's url), or None."""
    import fcntl

    try:
        fd = os.open(Path(journal).with_name(LOCK_FILE), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None  # nobody writes (our shared lock goes with the descriptor)
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)


def _holder(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:  # being rewritten this very moment
        return {}


def describe_holder(holder: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(holder["since"])) if "since" in holder else "?"
    where = f", page {holder['url']}" if holder.get("url") else ""
    return f"process {holder.get('pid', '?')} on {holder.get('host', '?')} (since {since}{where})"


class Journal:
    """The journal of one session, open for appending (thread-safe) by this process alone."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": round(time.time(), 3)}
        self._lock_fd = self._hold()  # first: only the one writer cuts a torn tail
        self._drop_torn_tail()
        self.records = {r["id"]: r for r in first_judgements(read_journal(self.path))[0]}
        self._done: dict[str, set[str]] = {}
        for r in self.records.values():
            self._done.setdefault(r["rater"], set()).add(r["item"])
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fsync_dir(self.path.parent)  # the file's own name survives a crash too

    def _hold(self) -> int:
        """journal.lock's descriptor, flocked, naming us; refused while another process holds it."""
        import fcntl

        fd = os.open(self.path.with_name(LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UserError(
                f"session {self.path.parent} is being judged already: {describe_holder(holder)} "
                "serves it. Judge on that page, or stop that server (Ctrl-C) first: two servers on "
                "one session would each record the same items") from None
        self._write_holder(fd)
        return fd

    def _write_holder(self, fd: int) -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self._holder).encode(), 0)

    def note_holder(self, **info) -> None:
        """Add `info` (a server's url) to what journal.lock tells a second server."""
        self._holder.update(info)
        self._write_holder(self._lock_fd)

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
        """(the judgement now on disk, whether it was there already: then it is the first one,
        and `record` is not written). `record` needs `rater`, `item` and `choice`; its id and
        time are added here."""
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
        os.ftruncate(self._lock_fd, 0)  # before letting go: the next holder writes its own
        os.close(self._lock_fd)  # lets go of the flock
