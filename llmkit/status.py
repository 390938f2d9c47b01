"""`llmkit status`: every artifact of a workspace — done, stale or incomplete — and the work
that stages left behind (killed, or split across --rank tasks): partial or damaged."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from llmkit.workspace import MANIFEST, WORK_INFO, resolve_input, sealed

REPORT = "summary.md"  # what `llmkit report` writes beside its plots


@dataclass
class ArtifactStatus:
    name: str
    stage: str
    state: str          # done | stale | incomplete | partial | damaged
    size: str           # rows or steps or bytes, whatever the artifact counts
    age_s: float | None


def _current_fingerprint(path: Path) -> str | None:
    if path.is_file():  # a raw input file of ingest
        from llmkit.data.ingest import file_fingerprint

        return file_fingerprint(path)
    try:
        return json.loads((path / MANIFEST).read_text())["fingerprint"]
    except (OSError, ValueError, KeyError):
        return None


def artifact_status(path: Path, root: Path) -> ArtifactStatus:
    name = str(path.relative_to(root))
    try:
        m = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return _unfinished_status(path, name)
    stale = any(_current_fingerprint(resolve_input(root, i["path"])) != i["fingerprint"]
                for i in m.get("inputs", []))
    stats = m.get("stats", {})
    if "rows_out" in stats:
        size = f"{stats['rows_out']:,} rows"
    elif "tokens" in stats:
        size = f"{stats['tokens']:,} tokens"
    elif "steps" in stats:
        size = f"{stats['steps']:,} steps"
    else:
        size = ""
    age = time.time() - (path / MANIFEST).stat().st_mtime
    return ArtifactStatus(name, m.get("stage", "?"), "stale" if stale else "done", size, age)


def _unfinished_status(path: Path, name: str) -> ArtifactStatus:
    """A folder without a manifest: a report (which has none), or an incomplete artifact;
    for a stopped training run, its newest complete step (where a rerun resumes)."""
    if (path / REPORT).is_file():
        plots = len(list(path.glob("*.png")))
        return ArtifactStatus(name, "report", "done", f"{plots} plots",
                              time.time() - (path / REPORT).stat().st_mtime)
    from llmkit.train.checkpoint import is_complete, step_dirs, step_of

    complete = [p for p in step_dirs(path) if is_complete(p)]
    if complete:
        return ArtifactStatus(name, "?", "incomplete",
                              f"step {step_of(complete[-1]):,} complete",
                              time.time() - complete[-1].stat().st_mtime)
    return ArtifactStatus(name, "?", "incomplete", "", None)


def work_status(work: Path) -> ArtifactStatus:
    """A work dir: its tasks whose markers and files are intact, and those damaged (a rerun
    of the stage redoes them)."""
    try:
        info = json.loads((work / WORK_INFO).read_text())
        artifact, stage, tasks, unit = info["artifact"], info["stage"], info["tasks"], info["unit"]
    except (OSError, ValueError, KeyError):
        artifact, stage, tasks, unit = work.name.rsplit("-", 1)[0], "?", None, "tasks"
    markers = list(work.rglob("*.done"))
    intact = sum(sealed(m) is not None for m in markers)
    damaged = len(markers) - intact
    size = f"{intact} of {tasks if tasks is not None else '?'} {unit}"
    if damaged:
        size += f", {damaged} damaged"
    age = time.time() - max(p.stat().st_mtime for p in [work, *markers])
    return ArtifactStatus(f"{artifact} (work)", stage, "damaged" if damaged else "partial",
                          size, age)


def workspace_status(ws) -> list[ArtifactStatus]:
    return ([artifact_status(p, ws.root) for p in ws.artifacts()]
            + [work_status(w) for w in ws.work_dirs()])


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"
