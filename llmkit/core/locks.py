"""Artifact locks: `NAME.lock` holds the pid and host of the one process building NAME.

A lock appears with its content, a dead owner's lock is cleared, a live one's is refused with
a message naming the process; see `acquire_lock`."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from llmkit.errors import UserError

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire_lock(path: Path, wait_for_writer: float = 1.0) -> Path:
    """Create `path` holding our pid and host; clear it if its owner is dead; else refuse.

    The lock appears with its content (a hard link to a written temp file), so a reader
    never sees an ownerless lock; one that reads empty or unparsable (a writer of an older
    llmkit mid-write) is waited on for `wait_for_writer` seconds before it counts as stale."""
    path = Path(path)
    mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
    # per thread too: two builders in one process must not share a temp file
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(mine)
    try:
        unreadable_since = None
        while True:
            try:
                _create_with(tmp, path, mine)
                return path
            except FileExistsError:
                pass
            try:
                seen = path.read_text()
                owner = json.loads(seen)
                pid, host = int(owner["pid"]), owner.get("host")
            except FileNotFoundError:  # released meanwhile: try again
                continue
            except OSError as e:
                raise UserError(f"cannot read lock {path} ({e}); remove it if no run is "
                                "building that artifact") from None
            except (ValueError, KeyError, TypeError):
                unreadable_since = unreadable_since or time.monotonic()
                if time.monotonic() - unreadable_since < wait_for_writer:
                    time.sleep(0.01)
                    continue
                pid, host = -1, None
            if host == socket.gethostname() and pid > 0 and _pid_alive(pid):
                raise UserError(
                    f"{path.with_suffix('')} is being built by process {pid} (lock {path}); "
                    "wait for it to finish, or stop it")
            if host not in (None, socket.gethostname()):
                raise UserError(f"{path} is held by {host} pid {pid}; remove it if that run died")
            print(f"warning: clearing stale lock {path} (process {pid} is gone)", file=sys.stderr)
            _clear_stale_lock(path, seen)
            unreadable_since = None
    finally:
        tmp.unlink(missing_ok=True)


def _create_with(tmp: Path, path: Path, content: str) -> None:
    """Create `path` holding `content` (the content of `tmp`); FileExistsError if it exists."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # a filesystem without hard links: readers wait out the empty moment
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        with os.fdopen(fd, "w") as f:
            f.write(content)


def _clear_stale_lock(path: Path, seen: str) -> None:
    """Remove the lock if it still holds `seen`: another builder may have cleared it and
    taken the lock since we read it, and that lock must stay. Clearers take turns (a flock
    on the folder, which the kernel drops if its holder dies), so none removes a lock that
    another just took."""
    import fcntl

    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if path.read_text() == seen:
            path.unlink()
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def release_lock(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)
