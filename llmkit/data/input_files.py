"""Evaluation files and the other inputs a stage names by path or artifact name: what
`llmkit eval` scores, and what `decontaminate`, `quality` and `ppl-filter` read the same way
(evaluation files, labelled examples, a KenLM model, the scoring checkpoint). eval/ and those
data stages import it downward; it reads through the data wing's I/O floor (data.io, ingest's
file fingerprint) and imports nothing from eval/ or train/ (tests/test_imports.py).

Files count as inputs of an artifact like datasets do: they enter its fingerprint (path, size
and modification time, as ingest's raw files) and its manifest, so editing one makes the
artifact stale. A multiple-choice row is an MMLU one (`choices` list, index answer) or a
C-Eval one (`A`…`D` fields, letter answer): `parse_question`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from llmkit.checkpoints.step_folders import checkpoint_step_dir, step_of
from llmkit.data.ingest import file_fingerprint
from llmkit.data.io import iter_batches, read_jsonl
from llmkit.errors import UserError
from llmkit.core.workspace import Artifact

FILE_STAGE = "file"  # the `stage` of an input given as a file, not an artifact


def eval_input(ws, spec: str) -> Artifact:
    """The artifact `spec` names in the workspace, or the file at path `spec`."""
    path = Path(spec)
    if path.is_file():
        return Artifact(path, {"fingerprint": file_fingerprint(path), "stage": FILE_STAGE})
    if path.suffix and not (ws.root / path).exists():  # a file name, not an artifact's
        raise UserError(f"{spec}: no such file (from {Path.cwd()}), nor an artifact of that name in "
                        f"workspace {ws.root}; give the path of an existing file")
    return ws.artifact(spec)


def resolve_checkpoint(ws, spec: str, step: str | None = None):
    """(run artifact, step folder name) of `--from`: one of a run's step folders, or a run and
    `step` (default its latest complete one)."""
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


# -- multiple-choice rows ----------------------------------------------------------------------

LETTERS = "ABCDEFGHIJ"
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


@dataclass
class Question:
    question: str
    choices: list[str]
    answer: int  # index into choices
    subject: str = ""

    @property
    def chinese(self) -> bool:
        return bool(CJK.search(self.question))


def parse_question(row: dict, where: str) -> Question:
    """A row of an MMLU (`choices` list, index answer) or C-Eval (`A`…`D` fields, letter) file."""
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise UserError(f"{where}: no `question` text")
    choices = row.get("choices")
    if choices is None:
        choices = [row[k] for k in LETTERS if row.get(k) is not None]
    if not isinstance(choices, list) or len(choices) < 2:
        raise UserError(f"{where}: needs at least two choices, as a `choices` list or `A`, `B`, … fields")
    choices = [str(c) for c in choices]
    answer = row.get("answer")
    if isinstance(answer, str) and answer.strip().upper() in LETTERS[:len(choices)]:
        index = LETTERS.index(answer.strip().upper())
    elif isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        index = answer
    else:
        raise UserError(f"{where}: `answer` must be a letter A–{LETTERS[len(choices) - 1]} or an "
                        f"index 0–{len(choices) - 1}, got {answer!r}")
    subject = row.get("subject") or row.get("category") or ""
    return Question(question.strip(), choices, index, str(subject))


def parse_questions(rows: list[dict], name: str) -> list[Question]:
    return [parse_question(r, f"{name} row {i + 1}") for i, r in enumerate(rows)]
