"""`llmkit status`: every artifact of a workspace — done, stale or incomplete."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from llmkit.workspace import MANIFEST


@dataclass
class ArtifactStatus:
    name: str
    stage: str
    state: str          # done | stale | incomplete
    size: str           # rows or steps or bytes, whatever the artifact counts
    age_s: float | None


def _current_fingerprint(path: str) -> str | None:
    p = Path(path)
    if p.is_file():  # a raw input file of ingest
        from llmkit.data.ingest import file_fingerprint

        return file_fingerprint(p)
    try:
        return json.loads((p / MANIFEST).read_text())["fingerprint"]
    except (OSError, ValueError, KeyError):
        return None


def artifact_status(path: Path, root: Path) -> ArtifactStatus:
    name = str(path.relative_to(root))
    try:
        m = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return ArtifactStatus(name, "?", "incomplete", "", None)
    stale = any(_current_fingerprint(i["path"]) != i["fingerprint"] for i in m.get("inputs", []))
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


def workspace_status(ws) -> list[ArtifactStatus]:
    return [artifact_status(p, ws.root) for p in ws.artifacts()]


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"
