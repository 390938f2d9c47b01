"""The workspace contract: artifacts that describe themselves and are complete or absent.

An artifact is a directory with `config.yaml` and `manifest.json`. The manifest is written
last and atomically, so its presence means "complete". A stage builds into a temporary
sibling (`NAME.tmp-<pid>/`) and renames it into place, holding `NAME.lock` meanwhile, so a
killed stage never leaves a half artifact that looks done and two writers never share one.
The fingerprint (llmkit version + stage + resolved config + input fingerprints,
llmkit.core.fingerprints) decides whether a re-run has anything to do.

A stage that splits its work into tasks keeps their results in `Builder.work_dir`, which
outlives killed runs; each task's `<task>.done` marker (`seal`) is written last and records
its files' sizes, so a rerun redoes a task whose files were lost or cut short (`sealed`).
"""

from __future__ import annotations

import difflib
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

from llmkit.core.config import config_to_dict
from llmkit.core.durable import _fsync_dir, kill_point, write_atomic
from llmkit.core.fingerprints import fingerprint_of, recorded_fingerprint
from llmkit.errors import UserError
from llmkit.core.locks import acquire_lock, release_lock
from llmkit.stages import OUTPUTS, build_command
from llmkit.core.targets import MANIFEST, check_target
from llmkit.version import __version__

CONFIG = "config.yaml"
WORK_INFO = "work.json"  # in a work dir: the artifact, stage and task count it is for


def resolve_input(root: Path, recorded: str) -> Path:
    """An input path as a manifest records it: relative to the workspace root, or absolute.
    Manifests written before llmkit recorded root-relative paths hold paths relative to
    the directory the stage ran in: those still resolve when run from there."""
    p = Path(recorded)
    if p.is_absolute():
        return p
    in_root = Path(root) / p
    return p if not in_root.exists() and p.exists() else in_root


def shown(root: Path) -> str:
    """A workspace root as a user typed it: `./workspace`, not a bare `workspace`."""
    text = str(root)
    return text if Path(root).is_absolute() or text.startswith(".") else f"./{text}"


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
    def open(cls, path: Path, root: Path | None = None) -> "Artifact":
        """The artifact at `path`, its inputs' paths resolved against the workspace `root`
        (default: the artifact's parent folder)."""
        path = Path(path)
        mf = path / MANIFEST
        if not mf.is_file():
            hf_config = path / "config.json"  # a transformers model folder, not an llmkit artifact
            if hf_config.is_file() and '"model_type"' in hf_config.read_text(errors="replace"):
                raise UserError(f"{path} holds a Hugging Face transformers config.json; turn the folder "
                                f"into an llmkit checkpoint with `llmkit import --from {path} --out NAME` first")
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
        for entry in manifest.get("inputs", []):
            entry["path"] = str(resolve_input(path.parent if root is None else root, entry["path"]))
        return cls(path, manifest)


class Workspace:
    """A directory of artifacts, addressed by name (`clean`) or by path."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, name: str) -> Path:
        return self.root / name

    def named(self, name_or_path: str | Path) -> Path:
        """Where an --in value points: a path when it is one, else the workspace's artifact of
        that name (or a folder of that name here, when the workspace has none)."""
        p = Path(name_or_path)
        if p.is_absolute() or os.sep in str(name_or_path):
            return p
        return p if p.exists() and not self.path(p).exists() else self.path(p)

    def artifact(self, name_or_path: str | Path) -> Artifact:
        path = self.named(name_or_path)
        if path.exists():
            return Artifact.open(path, self.root)
        name = str(name_or_path)
        command = build_command(name)
        here = {str(p.relative_to(self.root)) for p in self.artifacts()}
        close = difflib.get_close_matches(name, sorted(here | set(OUTPUTS)), n=1)
        if command:
            hint = f"build it first with `llmkit {command}`"
        elif close:
            hint = f"did you mean {close[0]!r}?" + (
                "" if close[0] in here else f" It is built by `llmkit {build_command(close[0])}`")
        else:
            hint = "run the stage that builds it first"
        raise UserError(f"no artifact {name!r} in workspace {shown(self.root)}; {hint} "
                        "(see `llmkit status`)")

    def builder(self, name: str, *, stage: str, config, inputs: list[Artifact] = (),
                force: bool = False, in_place: bool = False, quiet: bool = False,
                kind: str | None = None, defaults: dict | None = None) -> "Builder":
        """`kind` tells apart two artifacts one stage builds (a classifier and a dataset): neither
        replaces the other without --force. `defaults`: the settings' defaults where `config` is a
        dict (a dataclass knows its own; llmkit.core.fingerprints)."""
        return Builder(self, name, stage, config, list(inputs), force, in_place, quiet, kind, defaults)

    def artifacts(self) -> list[Path]:
        """Every artifact-like directory (complete or not), checkpoint-run folders and
        reports included."""
        if not self.root.is_dir():
            return []
        out = []
        for p in sorted(self.root.iterdir()):
            if p.is_dir() and not p.name.startswith(".") and ".tmp-" not in p.name:
                if _artifact_like(p):
                    out.append(p)
                else:  # nested names like eval/<name> or report/<name>
                    out.extend(c for c in sorted(p.iterdir()) if c.is_dir() and _artifact_like(c))
        return out

    def work_dirs(self) -> list[Path]:
        """The work dirs that stages left behind (killed, or split across --rank tasks)."""
        work = self.root / ".work"
        if not work.is_dir():
            return []
        return sorted(p for p in work.iterdir() if p.is_dir() and any(p.iterdir()))


def _artifact_like(p: Path) -> bool:
    # a manifest or config (data stages); a run fingerprint or step folder (a training run not
    # finished); summary.md (a report)
    return (any((p / f).exists() for f in (MANIFEST, CONFIG, "run_fingerprint", "summary.md"))
            or any(p.glob("step-*")))


class Builder:
    """Builds one artifact: up-to-date check, lock, temporary dir, atomic completion.

    Usage::

        b = ws.builder("clean", stage="clean", config=cfg, inputs=[raw])
        if b.up_to_date:
            return b
        with b:
            ... write files into b.dir, counts into b.stats ...
    """

    def __init__(self, ws, name, stage, config, inputs, force, in_place, quiet, kind=None, defaults=None):
        self.ws, self.name, self.stage, self.kind = ws, name, stage, kind
        self.config = config_to_dict(config)
        self.inputs = inputs
        self.in_place = in_place
        self.quiet = quiet
        self.final = ws.path(name)
        inputs_fingerprints = [a.fingerprint for a in inputs]
        self.fingerprint = fingerprint_of(stage, config_to_dict(config, fingerprint=True), inputs_fingerprints)
        self.stats: dict = {}
        self.extra: dict = {}
        self.started = time.time()
        self.dir = self.final if in_place else self.final.with_name(
            f"{self.final.name}.tmp-{os.getpid()}")
        self._lock: Path | None = None
        self.up_to_date = not force and self._built_alike(config, inputs_fingerprints, defaults)
        self.work_dir = ws.root / ".work" / f"{name.replace('/', '_')}-{self.fingerprint[:12]}"
        # an artifact up to date is this stage's own, whatever kind an older llmkit recorded; a run
        # continued in place may read what it keeps inside (a LoRA run's pinned base)
        check_target(self.final, root=ws.root, stage=stage, kind=kind or stage,
                     force=force or self.up_to_date, shown=name,
                     inputs=[a.path for a in inputs if not (in_place and self._inside(a.path))])
        if self.up_to_date:
            self._clear_leftovers()
            if not quiet:
                print(f"{name}: up to date ({self.final})")
        elif not force:
            self._refuse_to_replace_a_run()

    def _inside(self, path: Path) -> bool:
        return self.final.resolve() in Path(path).resolve().parents

    def _clear_leftovers(self) -> None:
        """What a run killed after renaming its artifact into place left: its work dir and,
        unless another builder is at work, its lock (taken and let go: that clears it)."""
        shutil.rmtree(self.work_dir, ignore_errors=True)
        lock = self.final.with_name(self.final.name + ".lock")
        if lock.exists():
            try:
                release_lock(acquire_lock(lock))
            except UserError:
                pass

    def _refuse_to_replace_a_run(self) -> None:
        """Without --force, a folder of complete checkpoints is replaced only by the run that
        continues it: reusing a name by mistake must not cost a finished run (a manifest's
        stage and kind are `check_target`'s)."""
        checkpoints = [p.name for p in self.final.glob("step-*/complete")]
        if self.in_place or not checkpoints or (self.final / MANIFEST).is_file():
            return
        raise UserError(
            f"{shown(self.final)} holds {len(checkpoints)} complete checkpoint(s) of a training run; "
            f"`llmkit {self.stage}` would replace it with its own output. Write elsewhere with --out "
            f"NEW_NAME, or add --force to replace it (its contents are deleted)")

    def _built_alike(self, config, inputs_fingerprints: list[str], defaults: dict | None) -> bool:
        """The artifact in place has this fingerprint, or had it as its llmkit spelled the config
        (settings added since at their defaults); then it keeps the fingerprint it has."""
        try:
            manifest = json.loads((self.final / MANIFEST).read_text())
            existing = manifest["fingerprint"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if existing == self.fingerprint:
            return True
        recorded = manifest.get("config")
        if isinstance(recorded, dict) and existing == recorded_fingerprint(
                self.stage, config, inputs_fingerprints, recorded, defaults):
            self.fingerprint = existing
            return True
        return False

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
        kill_point("build")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._commit()
                return
            if not self.in_place:
                shutil.rmtree(self.dir, ignore_errors=True)
            # a refusal (bad input, settings) fails the same way again: nothing in the work area
            # is worth resuming; a crash or an interrupt keeps what tasks wrote for the rerun
            if issubclass(exc_type, UserError) or not self._work_written():
                shutil.rmtree(self.work_dir, ignore_errors=True)
        finally:
            release_lock(self._lock)

    def _work_written(self) -> bool:
        return any(p.is_file() and p.name != WORK_INFO for p in self.work_dir.rglob("*"))

    def manifest(self) -> dict:
        return {
            "stage": self.stage,
            **({"kind": self.kind} if self.kind else {}),
            "llmkit_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "fingerprint": self.fingerprint,
            "inputs": [{"path": self._recorded(a.path), "fingerprint": a.fingerprint}
                       for a in self.inputs],
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

    def _recorded(self, path: Path) -> str:
        """Inputs inside the workspace relative to its root, others absolute: the manifest
        then reads the same from any directory (`resolve_input` reads it back)."""
        path = Path(path).resolve()
        try:
            return str(path.relative_to(self.ws.root.resolve()))
        except ValueError:
            return str(path)

    def start_work(self, tasks: int, unit: str) -> Path:
        """Create the work dir and record what it is for (`llmkit status` reports it)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.work_dir / WORK_INFO, json.dumps(
            {"artifact": self.name, "stage": self.stage, "tasks": tasks, "unit": unit}))
        return self.work_dir

    def _commit(self) -> None:
        import yaml

        write_atomic(self.dir / CONFIG, yaml.safe_dump(self.config, sort_keys=False,
                                                       allow_unicode=True))
        write_atomic(self.dir / MANIFEST, json.dumps(self.manifest(), indent=2,
                                                     ensure_ascii=False, default=str))
        kill_point("commit")
        if not self.in_place:
            old = self.final.with_name(f"{self.final.name}.old-{os.getpid()}")
            if self.final.exists():
                os.replace(self.final, old)
            os.replace(self.dir, self.final)
            kill_point("renamed")
            shutil.rmtree(old, ignore_errors=True)
            _fsync_dir(self.final.parent)
        shutil.rmtree(self.work_dir, ignore_errors=True)
