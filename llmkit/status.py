"""`llmkit status`: every artifact of a workspace — done, stale, incomplete or missing — in
pipeline order (an artifact after the inputs it was built from), the work that stages left behind
(killed, or split across --rank tasks): partial or damaged, and the commands that would bring
the workspace up to date."""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from llmkit.checkpoints.step_folders import is_complete, step_dirs, step_of
from llmkit.data.ingest import file_fingerprint
from llmkit.core.progress import is_tty
from llmkit.stages import BY_COMMAND, built_by, pipeline_rank
from llmkit.train.checkpoint import RUN_RECORD
from llmkit.checkpoints.lora import PINNED_BASE  # a LoRA run holds its base input itself
from llmkit.train.threads import threads_label
from llmkit.core.workspace import MANIFEST, WORK_INFO, resolve_input, shown
from llmkit.core.durable import sealed

REPORT = "summary.md"  # what `llmkit report` writes beside its plots
NEEDS_REBUILD = ("stale", "incomplete", "missing")


@dataclass
class ArtifactStatus:
    name: str
    stage: str
    state: str          # done | stale | incomplete | missing | partial | damaged
    size: str           # rows or steps or bytes, whatever the artifact counts
    age_s: float | None
    inputs: list[str] = field(default_factory=list)  # the artifacts it was built from (names)
    rebuild: str | None = None  # the command that rebuilds it, when it needs rebuilding
    why: str = ""       # what makes it stale: the input that changed, or the stale one upstream
    below_gate: str = ""  # a run under its general-ability gate: by how much (llmkit.train.gate)


def _current_fingerprint(path: Path) -> str | None:
    if path.is_file():  # a raw input file of ingest

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
        return _unfinished_status(path, name, root)
    changed = [i["path"] for i in m.get("inputs", [])
               if _current_fingerprint(resolve_input(root, i["path"])) != i["fingerprint"]
               and _current_fingerprint(path / PINNED_BASE) != i["fingerprint"]]
    stats = m.get("stats", {})
    if "rows_out" in stats:
        size = f"{stats['rows_out']:,} rows"
    elif "tokens" in stats:
        size = f"{stats['tokens']:,} tokens"
    elif "steps" in stats:  # a training run: what it computed on, too
        size = ", ".join(filter(None, [f"{stats['steps']:,} steps", threads_label(stats.get("threads"), short=True),
                                       stats.get("cpu_kernels")]))
    else:
        size = ""
    age = time.time() - (path / MANIFEST).stat().st_mtime
    stage = m.get("stage", "?")
    inputs = [_name_in(root, resolve_input(root, i["path"])) for i in m.get("inputs", [])]
    row = ArtifactStatus(name, stage, "stale" if changed else "done", size, age,
                         [i for i in inputs if i is not None])
    row.rebuild = _command_of(m.get("environment", {}).get("argv"), stage, name, root)
    gate = m.get("gate") or {}
    row.below_gate = "; ".join(f"{f}: {gate['files'][f]['base']:.3f} -> {gate['files'][f]['run']:.3f} "
                               f"(tolerance {gate['tolerance']})" for f in gate.get("failed", []))
    if changed:
        first = resolve_input(root, changed[0])
        row.why = f"{_name_in(root, first) or first} {'changed' if first.exists() else 'is missing'}"
    return row


def _name_in(root: Path, path: Path) -> str | None:
    """An input's artifact name (its path under the workspace root), or None for a file or
    folder outside it (ingest's raw files)."""
    try:
        return str(Path(os.path.abspath(path)).relative_to(os.path.abspath(root)))
    except ValueError:
        return None


def _command_of(argv: list[str] | None, stage: str, name: str, root: Path) -> str:
    """The command that built an artifact, as its manifest recorded it (run again, it rebuilds
    what changed); without one, `llmkit STAGE [OPTIONS]`: the options that give the stage's
    output this name (none for its default, `--out NAME` else). Pointed at this workspace."""
    args = list(argv or [])[1:]
    args = [a for a in args if not a.startswith(("--local_rank=", "--local-rank="))]
    if not args or args[0] != stage or Path((argv or ["?"])[0]).name not in ("llmkit", "__main__.py"):
        found = built_by(name)
        options = found[1] if found and found[0].command == stage else \
            "" if name == stage else f"--out {name}"
        args = [stage, *(["PATH..."] if stage == "ingest" else []), *options.split()]
    out, skip = [], False
    for a in args:  # the workspace as this status reads it
        if skip:
            skip = False
        elif a in ("-w", "--workspace"):
            skip = True
        elif not a.startswith("--workspace="):
            out.append(a)
    if Path(root) != Path("workspace") or os.environ.get("LLMKIT_WORKSPACE"):
        out += ["-w", str(root)]
    return shlex.join(["llmkit", *out])


def _unfinished_status(path: Path, name: str, root: Path) -> ArtifactStatus:
    """A folder without a manifest: a report (which has none), or an incomplete artifact;
    for a stopped training run, its newest complete step (where a rerun resumes)."""
    if (path / REPORT).is_file():
        plots = len(list(path.glob("*.png")))
        return ArtifactStatus(name, "report", "done", f"{plots} plots",
                              time.time() - (path / REPORT).stat().st_mtime)
    try:  # a training run records its inputs when it starts
        recorded = json.loads((path / RUN_RECORD).read_text())["inputs"]
        inputs = [_name_in(root, resolve_input(root, i["path"])) for i in recorded]
    except (OSError, ValueError, KeyError, TypeError):
        inputs = []
    stage = _builder(path.name)
    rebuild = _command_of(None, stage, name, root) if stage != "?" else None
    complete = [p for p in step_dirs(path) if is_complete(p)]
    if complete:
        return ArtifactStatus(name, "?", "incomplete", f"step {step_of(complete[-1]):,} complete",
                              time.time() - complete[-1].stat().st_mtime,
                              [i for i in inputs if i], rebuild, "resumes from its last step")
    return ArtifactStatus(name, "?", "incomplete", "", None, [i for i in inputs if i], rebuild)


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
    """Every artifact, work dir and missing input of the workspace, inputs before what is built
    from them (then in pipeline order); an artifact built from one that needs rebuilding needs
    it too (stale)."""
    rows = [artifact_status(p, ws.root) for p in ws.artifacts()] + \
        [work_status(w) for w in ws.work_dirs()]
    by_name = {r.name: r for r in rows}
    for r in list(rows):
        for name in r.inputs:
            if name not in by_name and not (ws.root / name).exists():  # deleted since it was used
                stage = _builder(name)
                by_name[name] = ArtifactStatus(
                    name, stage, "missing", "", None,
                    rebuild=_command_of(None, stage, name, ws.root) if stage != "?" else None)
                rows.append(by_name[name])
    rows = pipeline_order(rows)
    for r in rows:  # inputs come first, so a stale input is known before its dependents
        upstream = [i for i in r.inputs if i in by_name and by_name[i].state in NEEDS_REBUILD]
        if r.state == "done" and upstream:
            r.state, r.why = "stale", f"after {upstream[0]}"
    return rows


def pipeline_order(rows: list[ArtifactStatus]) -> list[ArtifactStatus]:
    """Inputs before the artifacts built from them; otherwise by stage in pipeline order, then
    by name (a stable topological order)."""
    names = {r.name for r in rows}
    waiting = {r.name: {i for i in r.inputs if i in names and i != r.name} for r in rows}

    def rank(r):
        return (pipeline_rank(r.stage if r.stage in BY_COMMAND else _builder(r.name)), r.name)

    out, done = [], set()
    pending = sorted(rows, key=rank)
    while pending:
        ready = next((r for r in pending if waiting[r.name] <= done), pending[0])  # [0]: a cycle
        pending.remove(ready)
        out.append(ready)
        done.add(ready.name)
    return out


def _builder(name: str) -> str:
    """The stage that writes an artifact of this name by itself, or "?"."""
    found = built_by(name)
    return found[0].command if found else "?"


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def print_status(ws) -> None:
    """The table `llmkit status` prints (a rich one on a terminal), then the commands that
    rebuild what is stale or missing, in the order to run them."""
    rows = workspace_status(ws)
    if not rows:
        print(f"workspace {shown(ws.root)} has no artifacts yet")
        return
    if is_tty():
        from rich.console import Console
        from rich.table import Table

        t = Table("artifact", "stage", "state", "size", "age", title=shown(ws.root))
        colour = {"done": "green", "stale": "yellow", "incomplete": "red", "partial": "yellow",
                  "damaged": "red", "missing": "red"}
        for r in rows:
            t.add_row(r.name, r.stage, f"[{colour[r.state]}]{r.state}", r.size, human_age(r.age_s))
        Console().print(t)
    else:
        print(f"{'artifact':<20} {'stage':<12} {'state':<11} {'size':<34} age")
        for r in rows:
            print(f"{r.name:<20} {r.stage:<12} {r.state:<11} {r.size:<34} {human_age(r.age_s)}")
    for r in rows:
        if r.state == "damaged":
            print(f"{r.name}: some finished tasks lost files since; rerun `llmkit {r.stage}` "
                  "(same config and inputs) and it redoes them")
    for r in rows:
        if r.below_gate:
            print(f"{r.name}: BELOW ITS GATE, {r.below_gate}")
    todo = [r for r in rows if r.state in NEEDS_REBUILD]
    if todo:
        print("\nto rebuild, run in this order:")
        for r in todo:
            why = f"{r.state}: {r.why}" if r.why else r.state
            print(f"  {r.rebuild}  # {r.name} {why}" if r.rebuild else
                  f"  # {r.name} {why}: rerun the stage that built it")
