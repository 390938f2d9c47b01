"""A small workspace on which every data stage runs as several tasks, and how to compare the
artifacts two runs of a stage made (tests/data/test_tasks.py, tests/data/test_on_ray.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from llmkit.cli.app import build_app

RAW = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "data" / "raw"
# ~100 KB of input files per ingest task: the demo's files give 4 tasks, so 4 parts after it
INGEST = ["ingest", RAW / "broken.jsonl", RAW / "en_docstrings.jsonl.gz", RAW / "noise.jsonl",
          RAW / "zh_poems.jsonl", "{ws}/prose.jsonl", "--set", "task_bytes=100000"]
# stage -> (the artifact a plain run writes, its command); `--out NAME` is added for others
STAGES = {
    "ingest": ("raw", INGEST),
    "clean": ("clean", ["clean", "--in", "raw"]),
    "dedup": ("dedup", ["dedup", "--in", "clean"]),
    "ppl-filter": ("filtered", ["ppl-filter", "--in", "dedup", "--model", "lm", "--set",
                                "max_chars=200", "--set", "group_by=source"]),
    "tokenize": ("tokens", ["tokenize", "--in", "dedup", "--tokenizer", "lm", "--set",
                            "val_fraction=0.05"]),
}


def llmkit(ws: Path, *args):
    r = CliRunner().invoke(build_app(), [str(a).format(ws=ws) for a in args] + ["-w", str(ws)])
    assert r.exit_code == 0, r.output
    return r


def build_workspace(ws: Path, tok) -> Path:
    """Each stage run once, in one process, in order (+ a tiny random scoring model `lm`)."""
    from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run

    ws.mkdir(parents=True)
    with open(RAW / "zh_prose.jsonl", encoding="utf-8") as f:
        (ws / "prose.jsonl").write_text("".join(next(f) for _ in range(500)), encoding="utf-8")
    write_checkpoint_run(ws, "lm", tiny_model(tok.vocab_size), tok)
    for artifact, args in STAGES.values():
        llmkit(ws, *args)
        assert len(list((ws / artifact).glob("part-*"))) > 1 or artifact == "tokens"
    return ws


def data_files(path: Path) -> dict[str, bytes]:
    """Every file of an artifact but its manifest (timings) and config.yaml (which records
    where it ran)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name not in ("manifest.json", "config.yaml")}


def stats(path: Path) -> dict:
    return {k: v for k, v in json.loads((path / "manifest.json").read_text())["stats"].items()
            if "second" not in k}


def assert_same_artifact(a: Path, b: Path) -> None:
    files_a, files_b = data_files(a), data_files(b)
    assert files_a.keys() == files_b.keys()
    assert [f for f in files_a if files_a[f] != files_b[f]] == []
    assert stats(a) == stats(b)


def remove(ws: Path, name: str) -> None:
    shutil.rmtree(ws / name, ignore_errors=True)
