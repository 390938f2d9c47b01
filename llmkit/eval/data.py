"""Evaluation inputs: checkpoints, and workspace datasets or jsonl / json / parquet files by path.

Files count as inputs of the eval artifact like datasets do: they enter its fingerprint (path,
size and modification time, as ingest's raw files) and its manifest, so editing an eval file
makes the report stale.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmkit.errors import UserError
from llmkit.workspace import Artifact

FILE_STAGE = "file"


def eval_input(ws, spec: str) -> Artifact:
    """The artifact `spec` names in the workspace, or the file at path `spec`."""
    path = Path(spec)
    if path.is_file():
        from llmkit.data.ingest import file_fingerprint

        return Artifact(path, {"fingerprint": file_fingerprint(path), "stage": FILE_STAGE})
    if path.suffix and not (ws.root / path).exists():  # a file name, not an artifact's
        raise UserError(f"{spec}: no such file (from {Path.cwd()}), nor an artifact of that name in "
                        f"workspace {ws.root}; give the path of an existing file")
    return ws.artifact(spec)


def resolve_checkpoint(ws, spec: str, step: str | None = None):
    """(run artifact, step folder name) of `--from`: one of a run's step folders, or a run and
    `step` (default its latest complete one)."""
    from llmkit.checkpoints import checkpoint_step_dir, step_of

    path = Path(spec)
    if step_of(path) is not None:
        run, step = ws.artifact(str(path.parent)), path.name
    else:
        run = ws.artifact(spec)
    return run, checkpoint_step_dir(run.path / step if step else run.path).name


def input_name(art: Artifact) -> str:
    """A short name for reports: the file name without extensions, or the artifact's name."""
    if art.stage == FILE_STAGE:
        name = art.path.name
        for suffix in (".gz", ".jsonl", ".json", ".parquet"):
            name = name.removesuffix(suffix)
        return name
    return art.name


def read_rows(art: Artifact, limit: int | None = None, columns: list[str] | None = None
              ) -> list[dict]:
    """The first `limit` rows (all when None) of a dataset artifact or an eval file."""
    if art.stage != FILE_STAGE or art.path.suffix == ".parquet":
        return _parquet_rows(art.path, limit, columns)
    if art.path.name.endswith((".jsonl", ".jsonl.gz")):
        return _jsonl_rows(art.path, limit)
    if art.path.suffix == ".json":
        try:
            rows = json.loads(art.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"{art.path}: not readable JSON ({e})") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise UserError(f"{art.path}: expected a JSON list of objects")
        return rows[:limit]
    raise UserError(f"{art.path}: eval files are .jsonl, .jsonl.gz, .json or .parquet")


def _jsonl_rows(path: Path, limit: int | None) -> list[dict]:
    from llmkit.data.io import read_jsonl

    rows = []
    for n, row in read_jsonl(path):
        if limit is not None and len(rows) >= limit:
            break
        if not isinstance(row, dict):
            raise UserError(f"{path}:{n}: expected a JSON object per line")
        rows.append(row)
    return rows


def _parquet_rows(path: Path, limit: int | None, columns: list[str] | None) -> list[dict]:
    if path.is_file():
        import pyarrow.parquet as pq

        batches = pq.ParquetFile(path).iter_batches(batch_size=4096, columns=columns)
    else:
        from llmkit.data.io import iter_batches

        batches = iter_batches(path, columns=columns, batch_size=4096)
    rows: list[dict] = []
    for batch in batches:
        rows += batch.to_pylist()
        if limit is not None and len(rows) >= limit:
            return rows[:limit]
    return rows


def require_columns(rows: list[dict], art: Artifact, *names: str) -> None:
    """UserError naming the input and row when a row lacks one of `names` ("a|b": either one)."""
    for i, row in enumerate(rows):
        missing = [n for n in names if all(row.get(k) is None for k in n.split("|"))]
        if missing:
            raise UserError(f"{art.path}: row {i + 1} has no {', '.join(missing)}; "
                            f"this evaluation needs {', '.join(names)}")
