"""Was the model under evaluation trained on data decontaminated against what it is scored on?

A score on a benchmark whose items were in the training data overstates the model. Every
artifact's manifest names its inputs, so the data a checkpoint learned from can be traced
back to where it entered the workspace (`llmkit ingest`, an imported model). A route back is
covered for an evaluation file when it passes an `llmkit decontaminate` artifact that indexed
that file's content (its SHA-256; a dataset's fingerprint), so a renamed or copied file still
counts and an edited one does not. `llmkit eval` warns, without failing, for each file some
route misses.

What a model learned from: a training run, from the run it started from and the data it read
(not its reference or reward model, tokenizer or held-out set: the first run and the first
dataset among its inputs, as the trainers list them); a dataset or token artifact, from its
dataset inputs (not a scoring model, nor a tokenizer).

lm-evaluation-harness tasks (`llmkit eval --tasks`) get a note each, covered or not
(`harness_notes`): the file(s) of the split a task is scored on, and either the decontaminate
artifacts that indexed them on every route or a route that none did. Few-shot files are not
checked: an example seen in training shows the format, it does not answer the question scored.
"""

from __future__ import annotations

from pathlib import Path

from llmkit.data.decontam_index import file_identity
from llmkit.errors import UserError
from llmkit.data.input_files import FILE_STAGE, input_name
from llmkit.stages import TRAINING
from llmkit.core.workspace import Artifact

MODEL_STAGES = (*TRAINING, "import")  # artifacts that are weights, not rows or tokens
NOT_DATA = (*MODEL_STAGES, "tokenizer", FILE_STAGE)


def contamination_warnings(run: Artifact, evaluated: list[Artifact]) -> dict:
    """{"warning: not decontaminated": "<file> (<route>); …"} for every evaluated file or dataset
    that some route of `run`'s training data never decontaminated against; {} when none."""
    lineage = Lineage(run.path.parent)
    misses = []
    for art in evaluated:
        route = lineage.uncovered_route(run, _identity(art))
        if route is not None:
            misses.append(f"{input_name(art)} ({' <- '.join(route)})")
    if not misses:
        return {}
    return {"warning: not decontaminated": "; ".join(misses) + " — scores may count leaked "
            "items: run `llmkit decontaminate --against FILE` before tokenize"}


def harness_notes(run: Artifact, task_files: dict[str, list[str] | None]) -> dict:
    """{"harness/<task>/decontaminated": "yes — …" | "no — …" | "unknown — …"} for each lm-eval
    task, given the files of the split it is scored on (None: data llmkit cannot trace)."""
    lineage = Lineage(run.path.parent)
    return {f"harness/{task}/decontaminated": _task_note(lineage, run, files)
            for task, files in task_files.items()}


def _task_note(lineage: Lineage, run: Artifact, files: list[str] | None) -> str:
    if not files:
        return "unknown — the task reads no local file llmkit can trace (a datasets cache or folder)"
    missed, by = [], set()
    for path in files:
        identity = _identity(Artifact(Path(path), {"stage": FILE_STAGE}))
        route = lineage.uncovered_route(run, identity)
        if route is None:
            by |= lineage.covered_by(run, identity)
        else:
            missed.append(f"{Path(path).name} ({' <- '.join(route)})")
    if missed:
        return (f"no — {'; '.join(missed)}: not among the decontamination inputs of the training "
                "data; scores may count leaked items")
    return f"yes — {', '.join(Path(p).name for p in files)} checked by {', '.join(sorted(by))}"


def _identity(art: Artifact) -> tuple:
    return tuple(file_identity(art).items())[0]


class Lineage:
    """The artifacts of a workspace as a graph of what learned from what."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._opened: dict[str, Artifact | None] = {}

    def uncovered_route(self, art: Artifact, identity: tuple) -> list[str] | None:
        """Names from `art` back to where data entered, along a route that no decontaminate
        artifact covered for `identity`; None when every route is covered."""
        if art.stage == "decontaminate" and identity in _decontaminated(art):
            return None
        sources = self.learned_from(art)
        if not sources:
            return [f"{art.name} (imported: trained outside the workspace)" if art.stage == "import"
                    else art.name]
        for source in sources:
            route = (self.uncovered_route(source, identity) if isinstance(source, Artifact)
                     else [source])
            if route is not None:
                return [art.name, *route]
        return None

    def covered_by(self, art: Artifact, identity: tuple) -> set[str]:
        """The decontaminate artifacts that indexed `identity` on the routes back from `art`."""
        if art.stage == "decontaminate" and identity in _decontaminated(art):
            return {art.name}
        return set().union(*(self.covered_by(source, identity) for source in self.learned_from(art)
                             if isinstance(source, Artifact)))

    def learned_from(self, art: Artifact) -> list:
        """The artifacts `art`'s content was made from (a str: one that could not be opened)."""
        if art.stage in ("ingest", "import", "tokenizer"):
            return []
        inputs = [self.open(entry["path"]) for entry in art.manifest.get("inputs", [])]
        missing = [f"{Path(e['path']).name} (missing)" for e, a in
                   zip(art.manifest.get("inputs", []), inputs) if a is None
                   and not Path(e["path"]).is_file()]
        opened = [a for a in inputs if a is not None]
        data = [a for a in opened if a.stage not in NOT_DATA]
        if art.stage in TRAINING:
            runs = [a for a in opened if a.stage in MODEL_STAGES]
            return runs[:1] + data[:1] + missing
        return data + missing

    def open(self, path: str) -> Artifact | None:
        if path not in self._opened:
            try:
                self._opened[path] = Artifact.open(Path(path), self.root) \
                    if Path(path).is_dir() else None
            except UserError:
                self._opened[path] = None
        return self._opened[path]


def _decontaminated(art: Artifact) -> set[tuple]:
    """The identities of the evaluation inputs a decontaminate artifact indexed."""
    out = set()
    for entry in art.stats.get("against", {}).values():
        for key in ("sha256", "fingerprint"):
            if key in entry:
                out.add((key, entry[key]))
    return out
