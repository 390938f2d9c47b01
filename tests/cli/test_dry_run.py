"""`--dry-run` of the training stages: nothing written, and the figures it prints hold for the
run it describes (parameters, checkpoint size, and memory against a measured run on CPU).
Also: a short run with the default warmup is valid."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from tests.conftest import write_jsonl
from tests.tokenizers.test_sentencepiece import small_corpus

TINY = ["model.preset=tiny", "model.hidden_size=32", "model.n_layers=2", "model.n_heads=2",
        "model.n_kv_heads=1", "model.intermediate_size=64", "model.max_seq_len=64", "seq_len=64",
        "micro_batch_size=2", "eval_every=0", "log_every=5"]
# big enough that training, not the libraries, is most of the memory it adds (5.0M parameters)
MEASURED = ["model.preset=tiny", "model.hidden_size=256", "model.n_layers=4", "model.n_heads=4",
            "model.n_kv_heads=2", "model.intermediate_size=704", "model.max_seq_len=256",
            "model.vocab_size=8192", "seq_len=256", "micro_batch_size=8", "eval_every=0",
            "max_steps=2", "log_every=1"]
PEAK_RSS = Path(__file__).with_name("peak_rss.py")


def llmkit(*args, expect=0):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == expect, r.output
    return r.output


def sets(settings):
    return [a for s in settings for a in ("--set", s)]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """Token shards and their tokenizer; a pretrain run of 20 steps with the default warmup
    (the base of the post-training dry runs); SFT, preference and prompt datasets."""
    tmp = tmp_path_factory.mktemp("dry_run")
    ws = tmp / "ws"
    rows = [{"id": f"d{i}", "text": t, "source": "s"} for i, t in enumerate(small_corpus(200))]
    llmkit("ingest", write_jsonl(tmp / "docs.jsonl", rows), "-w", ws, "--out", "dedup")
    llmkit("tokenizer", "-w", ws, "--in", "dedup", "--set", "vocab_size=400")
    llmkit("tokenize", "-w", ws, "--in", "dedup", "--set", "val_fraction=0.1")
    llmkit("pretrain", "-w", ws, *sets(TINY), "--set", "max_steps=20")  # warmup_steps left at default
    pairs = [{"prompt": f"q{i}", "chosen": "yes", "rejected": "no", "response": "yes", "answer": "yes"}
             for i in range(20)]
    for kind, name in (("sft", "sft_train"), ("preference", "pref_train"), ("prompt", "prompts_train")):
        llmkit("ingest", write_jsonl(tmp / f"{name}.jsonl", pairs), "--kind", kind, "--out", name, "-w", ws)
    return ws


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def test_default_warmup_lets_a_short_run_run(ws):
    config = yaml.safe_load((ws / "pretrain" / "config.yaml").read_text())
    assert (config["max_steps"], config["warmup_steps"]) == (20, 2)  # 10% of the run, not 100
    assert json.loads((ws / "pretrain" / "manifest.json").read_text())["stats"]["steps"] == 20
    out = llmkit("pretrain", "-w", ws, "--out", "never", *sets(TINY),
                 "--set", "max_steps=20", "--set", "warmup_steps=30", expect=2)
    assert "warmup_steps (30) exceeds max_steps (20)" in out


@pytest.mark.parametrize("command", [
    ["pretrain", *sets(TINY), "--set", "max_steps=40"],
    ["pretrain", "--from", "pretrain", "--out", "continued", *sets(TINY)],
    ["sft", "--from", "pretrain", "--set", "seq_len=64"],
    ["rm", "--from", "pretrain", "--set", "seq_len=64"],
    ["dpo", "--from", "pretrain", "--set", "seq_len=64"],
    ["ppo", "--from", "pretrain", "--set", "seq_len=64"],
    ["ppo", "--from", "pretrain", "--reward", "pretrain", "--set", "seq_len=64", "--set", "value_model=separate"],
], ids=["pretrain", "pretrain-from", "sft", "rm", "dpo", "ppo", "ppo-reward"])
def test_a_dry_run_prints_the_plan_and_writes_nothing(ws, command):
    before = tree(ws)
    out = llmkit(command[0], "-w", ws, "--dry-run", *command[1:])
    assert out.startswith(f"{command[0]} --dry-run: nothing is written\n")
    for label in ("parameters", "per step", "steps", "tokens in all", "memory per device",
                  "  activations", "checkpoint"):
        assert f"\n{label} " in out
    assert tree(ws) == before  # no artifact, lock, .work or run folder


def test_a_dry_run_refuses_what_the_run_would(ws):
    before = tree(ws)
    out = llmkit("sft", "-w", ws, "--dry-run", "--from", "pretrain", expect=2)  # seq_len 512 > 64
    assert "seq_len=512 exceeds the model's max_seq_len=64" in out
    assert "no artifact 'nothing'" in llmkit("pretrain", "-w", ws, "--dry-run", "--in", "nothing", expect=2)
    assert tree(ws) == before


def figure(out: str, label: str) -> float:
    """A size the dry run printed, in bytes (`memory per device   339.0 MiB`)."""
    value, unit = re.search(rf"^{label} +([\d,.]+) (KiB|MiB|GiB)", out, re.M).groups()
    return float(value.replace(",", "")) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]


def test_parameters_match_the_trained_run(ws):
    out = llmkit("pretrain", "-w", ws, "--dry-run", *sets(TINY), "--set", "max_steps=20")
    stats = json.loads((ws / "pretrain" / "manifest.json").read_text())["stats"]
    assert f"parameters          {stats['parameters']:,} " in out
    assert "per step            128 tokens, on 1 process" in out and "tokens in all       2,560" in out


@pytest.mark.slow
def test_memory_and_checkpoint_estimates_hold_for_a_real_run_on_cpu(ws):
    """A 5M-parameter pretrain run (2 steps of 8 × 256 tokens, fp32) in a fresh process: its peak
    resident memory above a warmed-up baseline (tests/cli/peak_rss.py), with glibc told to return
    freed tensors at once (MALLOC_MMAP_THRESHOLD_) so the resident size follows the live tensors,
    is the dry run's memory per device within 30% (measured: 338 MiB for 339 MiB estimated; with
    glibc's default allocator, which keeps some freed activations resident, 383-402 MiB). Its
    step folder is the estimated checkpoint size within 10% (80.9 MB for 77.0 MiB)."""
    args = ["pretrain", "-w", str(ws), "--out", "measured", *sets(MEASURED)]
    estimate = figure(llmkit(*args, "--dry-run"), "memory per device")
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # set by runs above
    env = {**{k: v for k, v in os.environ.items() if k not in launcher}, "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run([sys.executable, str(PEAK_RSS), str(ws), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    growth = json.loads(done.stdout.splitlines()[-1])["growth"]
    assert abs(growth - estimate) <= 0.3 * growth, (growth / 2**20, estimate / 2**20)

    step = ws / "measured" / "step-00000002"
    size = sum(p.stat().st_size for p in step.rglob("*") if p.is_file() and "tokenizer" not in p.parts)
    assert figure(llmkit(*args, "--dry-run"), "checkpoint") == pytest.approx(size, rel=0.1)
