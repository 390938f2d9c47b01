"""Where a command may write: a path the user names (`--out`, `--to`) is theirs.

llmkit replaces only what it built, of the same kind, and refuses the rest before anything is
read or written. Refused whatever --force says: the workspace, the current folder or a folder
holding either; a file; a folder with files llmkit did not write; the inside of another artifact;
the command's own input. Refused unless --force: an artifact another stage (or another kind of
the same stage: a classifier is not a dataset) built.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmkit.errors import UserError

MANIFEST = "manifest.json"
# what a checkpoint run holds before its manifest: its record (run.json, or run_fingerprint of
# earlier versions), the name of its newest step, step folders
RUN_MARKS = ("run.json", "run_fingerprint", "latest")


def built_by_llmkit(folder: Path) -> bool:
    """A folder an llmkit stage wrote: an artifact, or a training run not finished yet."""
    return ((folder / MANIFEST).is_file() or any((folder / m).is_file() for m in RUN_MARKS)
            or any(p.is_dir() for p in folder.glob("step-*")))


def recorded_kind(folder: Path) -> tuple[str, str] | None:
    """(stage, kind) of the artifact at `folder` from its manifest; None without one."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        stage = manifest.get("stage")
    except (OSError, ValueError, AttributeError):
        return None
    return (stage, manifest.get("kind") or stage) if stage else None


def check_target(target: Path, *, root: Path, stage: str, kind: str | None = None,
                 inputs: list[Path] = (), force: bool = False, shown: str | None = None) -> None:
    """Raise UserError when `stage`, writing an artifact of `kind`, must not replace `target`;
    `inputs` are the artifacts the command reads, `shown` how the user named it. Without a `kind`
    (the command line, before the stage knows what it builds) any kind of `stage` passes."""
    target = Path(target).resolve()
    label = shown or str(target)
    homes = {"the workspace": Path(root).resolve(), "the current folder": Path.cwd().resolve()}
    for what, home in homes.items():
        if target == home or target in home.parents:
            where = what if target == home else f"a folder that holds {what} ({home})"
            _refuse(label, f"is {where}; writing there would delete everything in it")
    for given in inputs:
        given = Path(given).resolve()
        if target == given or target in given.parents or given in target.parents:
            _refuse(label, f"is this command's own input ({given}) or overlaps it; write to another name")
    if target.exists() and not target.is_dir():
        _refuse(label, "is a file llmkit did not write")
    for parent in target.parents:
        if (parent / MANIFEST).is_file():
            _refuse(label, f"lies inside the artifact {parent}, which it would corrupt")
    if target.is_dir() and any(target.iterdir()) and not built_by_llmkit(target):
        some = ", ".join(sorted(p.name for p in target.iterdir())[:4])
        _refuse(label, f"is a folder of files llmkit did not write ({some}, …)")
    found = recorded_kind(target)
    if found and not force and (found[0] != stage or (kind and found[1] != kind)):
        built = f"`llmkit {found[0]}`" + (f" ({found[1]})" if found[1] != found[0] else "")
        raise UserError(
            f"{label} holds an artifact built by {built}; `llmkit {stage}` would replace it with its "
            f"own output{f' ({kind})' if kind and kind != stage else ''}. Write elsewhere with a new "
            f"name, or add --force to replace it (its contents are deleted)")


def _refuse(label: str, why: str) -> None:
    raise UserError(f"refusing to write to {label}: it {why}. llmkit replaces only artifacts it built "
                    "(even with --force); choose a new name")
