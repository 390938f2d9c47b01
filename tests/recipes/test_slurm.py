"""recipes/slurm: the sbatch array scripts and submit.sh, run by a stand-in `sbatch` that runs
each job at once, array task after array task (the dependencies then hold by construction),
give the artifacts of one-process runs; failed ranks resubmitted as a sparse array finish
the stage."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.stage_tasks import STAGES, assert_same_artifact, build_workspace, llmkit

SLURM = Path(__file__).resolve().parents[2] / "recipes" / "slurm"

FAKE_SBATCH = r'''#!/usr/bin/env python3
"""sbatch, as far as submit.sh needs it: run the script now, once per array index."""
import os, re, subprocess, sys
args = sys.argv[1:]
opts = []
while args[0].startswith("--"):
    opts.append(args.pop(0))
script, rest = args[0], args[1:]
array = next((o.split("=", 1)[1] for o in opts if o.startswith("--array=")), None)
if array is None:
    found = re.search(r"^#SBATCH --array=(\S+)", open(script).read(), re.M)
    array = found.group(1) if found and "dedup" not in script else None
indices = []  # "0-15", or sparse as failed ranks are resubmitted: "3,7", "0-2,5"
for part in array.split(",") if array else []:
    lo, _, hi = part.partition("-")
    indices += range(int(lo), int(hi or lo) + 1)
for index in indices or [None]:
    env = dict(os.environ, SLURM_CPUS_PER_TASK="1")
    if index is not None:  # what Slurm sets: the count is the array's, not the stage's ranks
        env.update(SLURM_ARRAY_TASK_ID=str(index), SLURM_ARRAY_TASK_COUNT=str(len(indices)),
                   SLURM_ARRAY_TASK_MIN=str(min(indices)), SLURM_ARRAY_TASK_MAX=str(max(indices)))
    with open(os.environ["SBATCH_LOG"], "a") as log:
        log.write(f"{os.path.basename(script)} {' '.join(rest)} [{index}]\n")
    subprocess.run(["bash", script, *rest], env=env, check=True, stdout=sys.stderr)  # a log
print(os.getpid())  # the job id
'''


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tok):
    return build_workspace(tmp_path_factory.mktemp("slurm") / "ws", tok)


def fake_sbatch(tmp_path: Path) -> Path:
    """A folder holding the stand-in `sbatch`, for PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    return bin_dir


def test_submit_runs_every_stage_as_array_tasks_then_assembles_the_one_process_artifacts(
        ws, tmp_path):
    bin_dir = fake_sbatch(tmp_path)
    slurm_ws = tmp_path / "ws"
    slurm_ws.mkdir()
    (slurm_ws / "prose.jsonl").write_bytes((ws / "prose.jsonl").read_bytes())
    os.symlink(ws / "lm", slurm_ws / "lm")  # the scoring model and tokenizer
    recipe = tmp_path / "recipe.yaml"  # the settings of the one-process runs
    recipe.write_text("ppl-filter: {max_chars: 200, group_by: source}\n"
                      "tokenize: {val_fraction: 0.05}\n")
    llmkit(ws, "tokenize", "--in", "filtered", "--tokenizer", "lm", "--out", "tokens_filtered",
           "--set", "val_fraction=0.05")
    ingest_args = [str(a).format(ws=slurm_ws) for a in STAGES["ingest"][1][1:]]
    env = dict(os.environ, PATH=f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
               LLMKIT_WORKSPACE=str(slurm_ws), TASKS="3", PPL_MODEL="lm", TOKENIZER="lm",
               RECIPE=str(recipe), SBATCH_LOG=str(tmp_path / "jobs.log"), OMP_NUM_THREADS="1")
    r = subprocess.run(["bash", str(SLURM / "submit.sh"), *ingest_args], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = (tmp_path / "jobs.log").read_text().splitlines()
    assert "dedup.sbatch signatures [2]" in jobs and "clean.sbatch  [0]" in jobs
    assert jobs[-1].startswith("assemble.sbatch tokenize --in filtered --tokenizer lm")
    for artifact in ("raw", "clean", "dedup", "filtered"):
        assert_same_artifact(ws / artifact, slurm_ws / artifact)
    assert_same_artifact(ws / "tokens_filtered", slurm_ws / "tokens")


def test_failed_ranks_resubmitted_as_a_sparse_array_finish_the_stage(ws, tmp_path):
    slurm_ws = tmp_path / "ws"
    shutil.copytree(ws / "raw", slurm_ws / "raw")
    env = dict(os.environ, LLMKIT_WORKSPACE=str(slurm_ws), TASKS="4", OMP_NUM_THREADS="1",
               PATH=f"{fake_sbatch(tmp_path)}:{Path(sys.executable).parent}:{os.environ['PATH']}",
               SBATCH_LOG=str(tmp_path / "jobs.log"))

    def sbatch(*args) -> str:
        r = subprocess.run(["sbatch", "--parsable", *args], env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stderr

    sbatch("--array=0,2", SLURM / "clean.sbatch")  # ranks 1 and 3 of 4 failed
    sbatch("--array=1,3", SLURM / "clean.sbatch")  # resubmitted: an array of 2
    (work,) = (slurm_ws / ".work").glob("clean-*")
    parts = len(list((ws / "raw").glob("part-*.parquet")))
    assert len(list((work / "split").glob("*.done"))) == parts  # every rank's tasks done
    log = sbatch(SLURM / "assemble.sbatch", "clean")
    assert f"clean: {parts} of {parts} tasks already done (resumed)" in log
    assert_same_artifact(ws / "clean", slurm_ws / "clean")
