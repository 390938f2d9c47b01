"""SIGKILL a stage at named points, then rerun it: the artifact equals an undisturbed run's.

Each stage runs as `llmkit <stage>` in its own process group (so pool workers die with it),
with `LLMKIT_KILL_AT=<point>`: the stage SIGKILLs itself there (`core.durable.kill_point`), so
every window is hit on every machine. The points: `build` (lock taken, temporary folder made),
`progress` (the first batch or task reported done), `checkpoint` (a step folder written, not
yet sealed), `tokenize:assemble` / `dedup:assemble` (before each work file is linked into the
artifact: `@2` is after the first one), `commit` (the manifest written, not renamed into
place), `renamed` (the artifact in place, its lock and work dir not yet cleared); `NAME@N` is
the N-th pass. Kills pile up on one workspace (stale locks, half-written
temporary folders, interrupted checkpoints, half-assembled artifacts) before the final rerun.
After every kill, an artifact that has a manifest must already be the finished one; the rerun
must then give the same rows in the same order (data stages) or the same per-step losses and
weights (training stages).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmkit.checkpoints import step_folders as ckpt
from llmkit.train.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
RAW = REPO / "recipes/demo/data/raw"
TASKS = REPO / "recipes/demo/data/tasks"
TINY_MODEL = ["model.preset=tiny", "model.hidden_size=32", "model.n_layers=2", "model.n_heads=2",
              "model.n_kv_heads=1", "model.intermediate_size=64", "model.max_seq_len=64"]
RUN = ["micro_batch_size=4", "log_every=1", "save_every=2", "warmup_steps=1", "eval_every=0"]


def settings(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


# stage -> (artifact, arguments); data stages that have --workers use two, so that a pool
# is killed too
STAGES = {
    "ingest": ("raw", ["ingest", RAW / "broken.jsonl", RAW / "noise.jsonl", RAW / "zh_poems.jsonl",
                       "{ws}/prose.jsonl"]),
    "clean": ("clean", ["clean", "--workers", "2"]),
    "dedup": ("dedup", ["dedup", "--workers", "2"]),
    "tokenizer": ("tokenizer", ["tokenizer", "--in", "dedup", "--workers", "2",
                                *settings("vocab_size=2000")]),
    "tokenize": ("tokens", ["tokenize", "--in", "dedup", "--workers", "2",
                            *settings("val_fraction=0.05")]),
    "pretrain": ("pretrain", ["pretrain", *settings(*TINY_MODEL, *RUN, "seq_len=64", "max_steps=10",
                                                    "lr=1e-2")]),
    "ppl-filter": ("filtered", ["ppl-filter", "--in", "dedup", "--model", "pretrain",
                                *settings("max_chars=200")]),
    "sft": ("sft", ["sft", "--from", "pretrain", "--in", "sft_train",
                    *settings(*RUN, "seq_len=64", "max_steps=10", "lr=1e-2")]),
    "dpo": ("dpo", ["dpo", "--from", "sft", "--in", "pref_train",
                    *settings(*RUN, "seq_len=64", "max_steps=8", "lr=1e-3")]),
}
TRAINING = {"pretrain", "sft", "dpo"}
# where each stage is killed, in order, before the final rerun
DATA_POINTS = ["build", "progress", "commit", "renamed"]
# a save cut short with no step to resume from, then one with a sealed step before it (a
# killed run holds its lock, as at `build`, which the data stages cover)
TRAINING_POINTS = ["checkpoint", "checkpoint@2"]
KILL_AT = {stage: TRAINING_POINTS if stage in TRAINING else DATA_POINTS for stage in STAGES}
KILL_AT["ppl-filter"] = ["progress", "commit"]  # each run loads a model: `build` as above
KILL_AT["dedup"] = ["progress", "dedup:assemble", "dedup:assemble@2", "commit", "renamed"]
KILL_AT["tokenize"] = ["progress", "tokenize:assemble", "tokenize:assemble@2", "commit", "renamed"]


def command(ws: Path, stage: str) -> list[str]:
    args = [str(a).format(ws=ws) for a in STAGES[stage][1]]
    return [sys.executable, "-c", "from llmkit.cli.app import main; main()", *args, "-w", str(ws)]


def environment(kill_at: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LLMKIT_KILL_AT")}
    return {**env, "OMP_NUM_THREADS": "1", **({"LLMKIT_KILL_AT": kill_at} if kill_at else {})}


def run_stage(ws: Path, stage: str, kill_at: str | None = None) -> None:
    """Run a stage to the end, or until it kills itself at point `kill_at` (which it must
    reach); then kill what is left of its process group (pool workers)."""
    proc = subprocess.Popen(command(ws, stage), env=environment(kill_at), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate(timeout=600)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    want = -signal.SIGKILL if kill_at else 0
    assert proc.returncode == want, f"{stage}, {kill_at}: exit {proc.returncode}\n{stderr[-3000:]}"


def write_task_data(ws: Path) -> None:
    """A slice of the demo's prose and task sets, as files the stages ingest."""
    ws.mkdir(parents=True)
    with open(RAW / "zh_prose.jsonl", encoding="utf-8") as f:
        (ws / "prose.jsonl").write_text("".join(next(f) for _ in range(800)), encoding="utf-8")
    for name, kind, rows in (("sft_train", "sft", 96), ("pref_train", "preference", 64)):
        with open(TASKS / f"{name}.jsonl", encoding="utf-8") as f:
            (ws / f"{name}.jsonl").write_text("".join(next(f) for _ in range(rows)), encoding="utf-8")
        subprocess.run([sys.executable, "-c", "from llmkit.cli.app import main; main()", "ingest",
                        str(ws / f"{name}.jsonl"), "--kind", kind, "--out", name, "-w", str(ws)],
                       env=environment(), check=True, capture_output=True)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """Every stage run once, undisturbed, in order: the workspace."""
    ws = tmp_path_factory.mktemp("kill") / "ws"
    write_task_data(ws)
    for stage in STAGES:
        run_stage(ws, stage)
    return ws


def artifact_files(path: Path) -> dict[str, bytes]:
    """Every file of a data artifact but its manifest (which records timings)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def stats(path: Path) -> dict:
    return {k: v for k, v in json.loads((path / "manifest.json").read_text())["stats"].items()
            if "second" not in k}


COMPARED = ("step", "loss", "lr", "grad_norm")


def run_record(path: Path) -> tuple[list[dict], dict]:
    """(per-step metrics, final weights) of a checkpoint run."""
    metrics = [{k: r.get(k) for k in COMPARED} for r in read_metrics(path) if "loss" in r]
    return metrics, ckpt.read_weights(path / ckpt.read_latest(path) / ckpt.WEIGHTS)


def assert_same_artifact(stage: str, got: Path, want: Path) -> None:
    if stage in TRAINING:
        import torch

        (got_metrics, got_weights), (want_metrics, want_weights) = run_record(got), run_record(want)
        assert got_metrics == want_metrics
        assert got_weights.keys() == want_weights.keys()
        assert all(torch.equal(got_weights[k], want_weights[k]) for k in want_weights)
    else:
        assert stats(got) == stats(want)
        assert artifact_files(got) == artifact_files(want)


@pytest.mark.slow
@pytest.mark.parametrize("stage", list(STAGES))
def test_killed_stage_reruns_to_the_undisturbed_artifact(tmp_path, pipeline, stage):
    straight_ws, name = pipeline, STAGES[stage][0]
    ws = tmp_path / "ws"
    shutil.copytree(straight_ws, ws, ignore=shutil.ignore_patterns(name, f"{name}.*"))
    for point in KILL_AT[stage]:
        run_stage(ws, stage, kill_at=point)
        if (ws / name / "manifest.json").exists():  # only ever the finished artifact
            assert_same_artifact(stage, ws / name, straight_ws / name)
    run_stage(ws, stage)
    assert_same_artifact(stage, ws / name, straight_ws / name)
    assert not list(ws.glob(f"{name}.tmp-*")) and not (ws / f"{name}.lock").exists()
    assert not (ws / ".work").exists() or not any((ws / ".work").iterdir())
