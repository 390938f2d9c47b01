"""The workspace contract: artifacts that describe themselves and are complete or absent.

An artifact is a directory with `config.yaml` and `manifest.json`. The manifest is written
last and atomically, so its presence means "complete". A stage builds into a temporary
sibling (`NAME.tmp-<pid>/`) and renames it into place, holding `NAME.lock` meanwhile, so a
killed stage never leaves a half artifact that looks done and two writers never share one.
The fingerprint (llmkit version + stage + resolved config + input fingerprints) decides
whether a re-run has anything to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from llmkit import __version__
from llmkit.config import config_to_dict
from llmkit.errors import UserError

MANIFEST = "manifest.json"
CONFIG = "config.yaml"


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


def fingerprint_of(stage: str, config: dict, input_fingerprints: list[str]) -> str:
    blob = json.dumps(
        {"llmkit": __version__, "stage": stage, "config": config, "inputs": input_fingerprints},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


# the stage that writes each default artifact name, for "what to do" in a missing-input error
BUILT_BY = {"raw": "ingest", "clean": "clean", "dedup": "dedup", "filtered": "ppl-filter",
            "tokenizer": "tokenizer", "tokens": "tokenize", "pretrain": "pretrain", "sft": "sft",
            "rm": "rm", "dpo": "dpo", "ppo": "ppo", "sft_train": "ingest --kind sft",
            "pref_train": "ingest --kind preference", "prompts_train": "ingest --kind prompt"}


@dataclass
class Artifact:
    """A complete artifact: a directory whose manifest.json exists."""

    path: Path
    manifest: dict

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def stage(self) -> str:
        return self.manifest.get("stage", "?")

    @property
    def stats(self) -> dict:
        return self.manifest.get("stats", {})

    @property
    def config(self) -> dict:
        return self.manifest.get("config", {})

    @classmethod
    def open(cls, path: Path) -> "Artifact":
        path = Path(path)
        mf = path / MANIFEST
        if not mf.is_file():
            if path.is_dir():
                raise UserError(
                    f"{path} has no {MANIFEST}: it is incomplete (a stage was interrupted?). "
                    "Re-run the stage that builds it."
                )
            raise UserError(f"{path} does not exist; run the stage that builds it first")
        try:
            manifest = json.loads(mf.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"{mf} is unreadable ({e}); rebuild it with --force") from None
        return cls(path, manifest)


class Workspace:
    """A directory of artifacts, addressed by name (`clean`) or by path."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, name: str) -> Path:
        return self.root / name

    def artifact(self, name_or_path: str | Path) -> Artifact:
        p = Path(name_or_path)
        candidates = [p] if (p.is_absolute() or os.sep in str(name_or_path)) else [self.root / p, p]
        for c in candidates:
            if c.exists():
                return Artifact.open(c)
        stage = BUILT_BY.get(str(name_or_path))
        hint = f"build it first with `llmkit {stage}`" if stage else "run the stage that builds it first"
        raise UserError(
            f"no artifact {str(name_or_path)!r} in workspace {self.root}; {hint} (see `llmkit status`)"
        )

    def builder(self, name: str, *, stage: str, config, inputs: list[Artifact] = (),
                force: bool = False, in_place: bool = False, quiet: bool = False) -> "Builder":
        return Builder(self, name, stage, config, list(inputs), force, in_place, quiet)

    def artifacts(self) -> list[Path]:
        """Every artifact-like directory (complete or not), checkpoint-run folders included."""
        if not self.root.is_dir():
            return []
        out = []
        for p in sorted(self.root.iterdir()):
            if p.is_dir() and not p.name.startswith(".") and ".tmp-" not in p.name:
                if (p / MANIFEST).exists() or (p / CONFIG).exists():
                    out.append(p)
                elif p.is_dir():
                    # nested names like eval/<name> or demo/<x>
                    out.extend(c for c in sorted(p.iterdir())
                               if c.is_dir() and ((c / MANIFEST).exists() or (c / CONFIG).exists()))
        return out


class Builder:
    """Builds one artifact: up-to-date check, lock, temporary dir, atomic completion.

    Usage::

        b = ws.builder("clean", stage="clean", config=cfg, inputs=[raw])
        if b.up_to_date:
            return b
        with b:
            ... write files into b.dir, counts into b.stats ...
    """

    def __init__(self, ws, name, stage, config, inputs, force, in_place, quiet):
        self.ws, self.name, self.stage = ws, name, stage
        self.config = config_to_dict(config)
        self.inputs = inputs
        self.in_place = in_place
        self.quiet = quiet
        self.final = ws.path(name)
        self.fingerprint = fingerprint_of(stage, self.config, [a.fingerprint for a in inputs])
        self.stats: dict = {}
        self.extra: dict = {}
        self.started = time.time()
        self.dir = self.final if in_place else self.final.with_name(
            f"{self.final.name}.tmp-{os.getpid()}")
        self.work_dir = ws.root / ".work" / f"{name.replace('/', '_')}-{self.fingerprint[:12]}"
        self._lock: Path | None = None
        self.up_to_date = not force and self._existing_fingerprint() == self.fingerprint
        if self.up_to_date and not quiet:
            print(f"{name}: up to date ({self.final})")

    def _existing_fingerprint(self) -> str | None:
        try:
            return json.loads((self.final / MANIFEST).read_text())["fingerprint"]
        except (OSError, ValueError, KeyError):
            return None

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> "Builder":
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self._lock = acquire_lock(self.final.with_name(self.final.name + ".lock"))
        if self.in_place:
            # the old manifest goes first: from here on the run is incomplete until we finish
            (self.final / MANIFEST).unlink(missing_ok=True)
            self.dir.mkdir(parents=True, exist_ok=True)
        else:
            for stale in self.final.parent.glob(f"{self.final.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            self.dir.mkdir(parents=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._commit()
            elif not self.in_place:
                shutil.rmtree(self.dir, ignore_errors=True)
        finally:
            release_lock(self._lock)

    def manifest(self) -> dict:
        return {
            "stage": self.stage,
            "llmkit_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "fingerprint": self.fingerprint,
            "inputs": [{"path": str(a.path), "fingerprint": a.fingerprint} for a in self.inputs],
            "config": self.config,
            "seconds": round(time.time() - self.started, 3),
            "stats": self.stats,
            "environment": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "host": socket.gethostname(),
                "argv": sys.argv,
            },
            **self.extra,
        }

    def _commit(self) -> None:
        import yaml

        write_atomic(self.dir / CONFIG, yaml.safe_dump(self.config, sort_keys=False,
                                                       allow_unicode=True))
        write_atomic(self.dir / MANIFEST, json.dumps(self.manifest(), indent=2,
                                                     ensure_ascii=False, default=str))
        if not self.in_place:
            old = self.final.with_name(f"{self.final.name}.old-{os.getpid()}")
            if self.final.exists():
                os.replace(self.final, old)
            os.replace(self.dir, self.final)
            shutil.rmtree(old, ignore_errors=True)
            _fsync_dir(self.final.parent)
        shutil.rmtree(self.work_dir, ignore_errors=True)


# -- locks ---------------------------------------------------------------------------------

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire_lock(path: Path) -> Path:
    """Create `path` exclusively with our pid; clear it if its owner is dead; else refuse."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                owner = json.loads(path.read_text())
                pid, host = int(owner["pid"]), owner.get("host")
            except (OSError, ValueError, KeyError):
                pid, host = -1, None
            if host == socket.gethostname() and pid > 0 and _pid_alive(pid):
                raise UserError(
                    f"{path.with_suffix('')} is being built by process {pid} (lock {path}); "
                    "wait for it to finish, or stop it"
                ) from None
            if host not in (None, socket.gethostname()):
                raise UserError(f"{path} is held by {host} pid {pid}; remove it if that run died")
            print(f"warning: clearing stale lock {path} (process {pid} is gone)", file=sys.stderr)
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}, f)
        return path
    raise UserError(f"could not take lock {path}")


def release_lock(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)
