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
"""

from __future__ import annotations

from pathlib import Path

from llmkit.data.decontam_index import file_identity
from llmkit.errors import UserError
from llmkit.eval.data import FILE_STAGE, input_name
from llmkit.stages import TRAINING
from llmkit.workspace import Artifact

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
            return [art.name]
        for source in sources:
            route = (self.uncovered_route(source, identity) if isinstance(source, Artifact)
                     else [source])
            if route is not None:
                return [art.name, *route]
        return None

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
