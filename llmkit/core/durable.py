"""Files that survive a kill: writes that land whole or not at all, task markers that vouch for
their files, hard links into an artifact being built, and the named crash windows tests kill at.

Every stage's durability rests on these few functions (the workspace's commit, the data driver's
task markers, checkpoints, the judge's journal), so they live apart from the artifacts above them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections import Counter
from pathlib import Path


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write, fsync and rename: readers see the old file or the new one, never a torn one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_passes: Counter = Counter()


def kill_point(name: str) -> None:
    """A named crash window for tests: `LLMKIT_KILL_AT=NAME` SIGKILLs this process the first
    time it gets here, `NAME@N` the N-th time (tests/reliability/test_kill_anywhere.py).
    With `LLMKIT_KILL_ONCE=FILE` as well, only the first process of all to get there dies (it
    makes FILE): a task that Ray runs again in a fresh worker process then goes through."""
    want = os.environ.get("LLMKIT_KILL_AT")
    if want and want.partition("@")[0] == name:
        _passes[name] += 1
        if _passes[name] == int(want.partition("@")[2] or 1) and _first_to_die():
            os.kill(os.getpid(), signal.SIGKILL)


def _first_to_die() -> bool:
    once = os.environ.get("LLMKIT_KILL_ONCE")
    if not once:
        return True
    try:
        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def seal(marker: Path, files: list[Path], info: dict) -> None:
    """Mark a task done, after its files are in place: `info` and each file's size.
    Renamed into place, not fsynced: a killed process leaves its writes in the page cache,
    and an fsync per task costs more than small tasks themselves."""
    marker = Path(marker)
    sizes = {str(Path(f).relative_to(marker.parent)): Path(f).stat().st_size for f in files}
    tmp = marker.with_name(f"{marker.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({**info, "files": sizes}))
    os.replace(tmp, marker)


def sealed(marker: Path) -> dict | None:
    """A task marker's info if the marker and every file it lists are intact, else None."""
    marker = Path(marker)
    try:
        info = json.loads(marker.read_text())
        intact = all((marker.parent / f).stat().st_size == n for f, n in info["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return info if intact else None


def link_or_copy(src: Path, dest: Path) -> None:
    """Put a work file into an artifact being built without taking it from the work dir,
    which a rerun needs until the artifact is committed."""
    try:
        os.link(src, dest)
    except OSError:  # a filesystem without hard links
        shutil.copyfile(src, dest)
