"""Training stages under the launchers a GPU cluster uses — `torchrun` and `deepspeed` — run as
two CPU processes (gloo): the losses equal one process with the same global batch, post-training
writes one artifact and prints one summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmkit.train.distributed import free_port
from llmkit.train.metrics import read_metrics
from tests.train.posttrain_fixtures import (addition_rows, make_tokenizer, preference_rows,
                                            tiny_model, write_checkpoint_run, write_dataset)
from tests.train.test_pretrain import TINY, llmkit, token_workspace

pytestmark = pytest.mark.slow
LLMKIT = str(Path(sys.executable).parent / "llmkit")


def launch(launcher: str, stage: str, ws: Path, *args: str) -> subprocess.CompletedProcess:
    port = str(free_port())
    prefix = {"torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", port],
              "deepspeed": [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", "2",
                            "--master_port", port]}[launcher]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run([*prefix, LLMKIT, stage, "-w", str(ws), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def tokens_ws(tmp_path_factory):
    return token_workspace(tmp_path_factory.mktemp("tokens"))


def sets(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_pretrain_on_two_processes_equals_one_with_the_same_global_batch(tokens_ws, launcher):
    tiny = sets(*TINY, "max_steps=3", "micro_batch_size=2", "eval_every=0", "save_every=0")
    llmkit("pretrain", "-w", tokens_ws, "--out", "one", *tiny, "--set", "grad_accum=2")
    launch(launcher, "pretrain", tokens_ws, "--out", f"two-{launcher}", *tiny)
    one, two = read_metrics(tokens_ws / "one"), read_metrics(tokens_ws / f"two-{launcher}")
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-5)
    assert [r["tokens_seen"] for r in two] == [r["tokens_seen"] for r in one]


@pytest.fixture(scope="module")
def post_ws(tmp_path_factory):
    from llmkit.model.reward_model import RewardModel

    ws = tmp_path_factory.mktemp("launch") / "ws"
    tok = make_tokenizer(ws.parent / "tok")
    write_checkpoint_run(ws, "sft", tiny_model(tok.vocab_size), tok)
    rm = RewardModel(tiny_model(tok.vocab_size, seed=1))
    write_checkpoint_run(ws, "rm", rm, tok, config=rm.checkpoint_config())
    write_dataset(ws, "sft_train", addition_rows(32))
    write_dataset(ws, "prompts_train", [{"id": r["id"], "prompt": r["prompt"], "answer": r["answer"]}
                                        for r in preference_rows(16)])
    return ws


POST = ("max_steps=2", "warmup_steps=0", "seq_len=64", "eval_every=0", "eval_records=2",
        "max_new_tokens=4", "log_every=1")


def test_sft_zero3_on_two_processes_equals_zero0_on_one(post_ws):
    """The step's loss is a mean over its labelled tokens on both processes: each process
    normalising by its own tokens would weigh the one with fewer more."""
    one = sets(*POST, "micro_batch_size=2", "grad_accum=4")
    llmkit("sft", "-w", post_ws, "--from", "sft", "--out", "sft-one", *one)
    launch("torchrun", "sft", post_ws, "--from", "sft", "--out", "sft-two",
           *sets(*POST, "micro_batch_size=2", "grad_accum=2", "zero_stage=3"))
    one, two = read_metrics(post_ws / "sft-one"), read_metrics(post_ws / "sft-two")
    assert two[0]["grad_norm"] == pytest.approx(one[0]["grad_norm"], rel=1e-5)
    assert two[1]["loss"] == pytest.approx(one[1]["loss"], rel=1e-5)


@pytest.mark.parametrize("algo, reward", [("ppo", ["--reward", "rm"]), ("grpo", ["--set", "reward=verify"]),
                                          ("rloo", ["--set", "reward=verify"])])
def test_ppo_on_two_processes_writes_one_artifact_and_one_summary(post_ws, algo, reward):
    out = f"ppo-{algo}"
    done = launch("torchrun", "ppo", post_ws, "--from", "sft", "--out", out, *reward,
                  *sets(*POST, f"algo={algo}", "micro_batch_size=2", "prompts_per_rollout=4",
                        "group_size=2"))
    assert done.stdout.count(f"{out} done") == 1
    manifest = json.loads((post_ws / out / "manifest.json").read_text())
    assert manifest["stats"]["steps"] == 2 and manifest["stats"]["algo"] == algo
    assert not list(post_ws.glob(f"{out}.tmp-*")) and not (post_ws / f"{out}.lock").exists()
