"""The same inputs and settings give the same data artifacts, byte for byte: every data stage run
at --workers 1 in one directory and at --workers 2 in another, on real text of the demo corpus,
input files named by absolute paths (as the demo's Makefile names them)."""

import gzip
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.ingest import input_names
from llmkit.model.transformer import Transformer
from llmkit.model.config import ModelConfig
from llmkit.tokenizers.sentencepiece import Tokenizer
from llmkit.data.tokenizer_training import TokenizerConfig, train_sentencepiece
from tests.train.posttrain_fixtures import write_checkpoint_run

RAW = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "data" / "raw"
# (file, documents taken): every kind of text of the demo, its broken lines and planted copies
SLICES = (("broken.jsonl", 10), ("noise.jsonl", 60), ("zh_poems.jsonl", 20),
          ("zh_prose.jsonl", 40), ("en_docstrings.jsonl.gz", 250))
STAGES = ("raw", "clean", "dedup", "tokenizer", "filtered", "tokens")
# what records a run, not what it made: times, paths, --workers
RUN_RECORDS = {"manifest.json", "config.yaml"}


def write_corpus(data: Path) -> list[Path]:
    """The demo's files cut short; zh_prose without its ids, so ingest generates them."""
    data.mkdir(parents=True)
    for name, n in SLICES:
        opener = gzip.open if name.endswith(".gz") else open
        with opener(RAW / name, "rb") as f:  # bytes: broken.jsonl holds invalid UTF-8
            lines = [next(f) for _ in range(n)]
        if name == "zh_prose.jsonl":
            lines = [json.dumps({k: v for k, v in json.loads(line).items() if k != "id"},
                                ensure_ascii=False).encode() + b"\n" for line in lines]
        (data / name.removesuffix(".gz")).write_bytes(b"".join(lines))
    return sorted(data.iterdir())


def scorer(ws: Path) -> None:
    """A tiny untrained LM on the workspace's tokenizer, the same weights in every workspace."""
    tok = Tokenizer(ws / "tokenizer")
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, n_layers=1,
                                    n_heads=2, n_kv_heads=1, intermediate_size=64,
                                    max_seq_len=128))
    write_checkpoint_run(ws, "scorer", model, tok)


def run_pipeline(root: Path, workers: int) -> Path:
    """ingest -> clean -> dedup -> tokenizer -> ppl-filter -> tokenize in `root/ws`."""
    files = write_corpus(root / "data")
    ws = root / "ws"
    common = ["-w", ws, "--workers", workers]
    steps = [["ingest", *files, "--set", "task_bytes=1"],  # a task per file, spread
             ["clean"], ["dedup"],
             # ~450 characters at this coverage: the rest of the vocabulary is merges
             ["tokenizer", "--in", "dedup", "--set", "vocab_size=2000",
              "--set", "character_coverage=0.99", "--set", "heldout_fraction=0.05"],
             ["ppl-filter", "--in", "dedup", "--model", "scorer", "--set", "max_chars=200",
              "--set", "percentiles=50,90"],
             ["tokenize", "--in", "filtered", "--set", "val_fraction=0.1",
              "--set", "task_bytes=100000"]]
    for step in steps:
        if step[0] == "ppl-filter":
            scorer(ws)
        r = CliRunner().invoke(build_app(), [str(a) for a in [*step, *common]])
        assert r.exit_code == 0, f"{step[0]}: {r.output}"
    return ws


def data_files(artifact: Path) -> dict[str, bytes]:
    return {p.relative_to(artifact).as_posix(): p.read_bytes()
            for p in sorted(artifact.rglob("*")) if p.is_file() and p.name not in RUN_RECORDS}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The pipeline at 1 worker, and at 2 in a directory of another depth and name."""
    one = run_pipeline(tmp_path_factory.mktemp("one"), workers=1)
    two = run_pipeline(tmp_path_factory.mktemp("elsewhere") / "deeper" / "two", workers=2)
    return one, two


@pytest.mark.slow  # stages on 2 processes
@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_gives_the_same_bytes_at_any_workers_and_in_any_directory(two_runs, stage):
    one, two = (data_files(ws / stage) for ws in two_runs)
    assert sorted(one) == sorted(two)
    assert [name for name in one if one[name] != two[name]] == []


@pytest.mark.slow
def test_the_runs_did_split_work_remove_rows_and_merge_pieces(two_runs):
    """What the comparison rests on: parts spread over tasks, rows removed by every filter, a
    vocabulary mostly of merges, and shards of both splits."""
    one, _ = two_runs
    assert len(list((one / "raw").glob("part-*.parquet"))) == len(SLICES)
    for stage in ("raw", "clean", "dedup", "filtered"):
        assert stats_of(one / stage)["rows_removed"] > 0, stage
    assert stats_of(one / "tokenizer")["required_chars"] < 600  # of 2000 pieces
    assert {p.parent.name for p in (one / "tokens").glob("*/shard-*.bin")} == {"train", "val"}


def stats_of(artifact: Path) -> dict:
    return json.loads((artifact / "manifest.json").read_text())["stats"]


def test_files_are_named_below_their_common_folder_whatever_the_path_typed(tmp_path):
    typed = [Path("data/a.jsonl"), tmp_path / "x" / "data" / "sub" / "b.jsonl"]
    assert input_names(typed, tmp_path / "x") == {"data/a.jsonl": "a.jsonl",
                                                  str(typed[1]): "sub/b.jsonl"}
    assert input_names([Path("/elsewhere/c.jsonl")], tmp_path) == {"/elsewhere/c.jsonl": "c.jsonl"}


def test_the_tokenizer_model_is_the_same_file_at_any_thread_count():
    with gzip.open(RAW / "en_docstrings.jsonl.gz", "rb") as f:
        texts = [json.loads(next(f))["text"] for _ in range(100)]
    cfg = TokenizerConfig(vocab_size=1000)
    models = {train_sentencepiece(texts, cfg, workers=w, log=print)[0] for w in (1, 2, 3)}
    assert len(models) == 1


def test_ingest_gives_the_same_rows_for_the_same_file_anywhere(tmp_path):
    """Generated ids and removed rows' locations name the file, not the folder it lies in."""
    rows = b'{"text": "no id here"}\n{"text": "nor here"}\n{"text": broken\n'
    artifacts = []
    for folder in (tmp_path / "a", tmp_path / "b" / "much" / "deeper"):
        folder.mkdir(parents=True)
        (folder / "docs.jsonl").write_bytes(rows)
        r = CliRunner().invoke(build_app(), ["ingest", str(folder / "docs.jsonl"),
                                             "-w", str(folder / "ws")])
        assert r.exit_code == 0, r.output
        artifacts.append(data_files(folder / "ws" / "raw"))
    assert artifacts[0] == artifacts[1]
    assert sorted(artifacts[0]) == ["part-00000.parquet", "removed/part-00000.parquet"]
