"""Every command runs with the network shut: the README's commands that touch models (LoRA sft,
generate, eval --tasks, export) on a tiny LoRA run, with a fresh HOME and none of the offline
switches set by the user, try no connection other than loopback, and the hub libraries were
imported offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.posttrain_fixtures import addition_rows, tiny_model, write_checkpoint_run, write_dataset

ROOT = Path(__file__).resolve().parents[2]

# Runs `llmkit` once per command line of argv[1] (a JSON list) in this one process, so the
# libraries are imported once. Every name lookup, connect and sendto of a non-loopback address is
# recorded, then refused; the hub libraries' offline constants (read when they are imported) are
# reported at the end.
GUARDED = r"""
import ipaddress, json, socket, sys

attempts = []

def loopback(host):
    if host in (None, "", "localhost") or isinstance(host, bytes) and host == b"localhost":
        return True
    try:
        return ipaddress.ip_address(host.decode() if isinstance(host, bytes) else host).is_loopback
    except ValueError:
        return False

def guard(what, host):
    if not loopback(host):
        attempts.append(f"{what} {host}")
        raise OSError(f"the network is shut in this test: {what} {host}")

real_getaddrinfo, real_connect, real_connect_ex, real_sendto = (
    socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto)

def getaddrinfo(host, *args, **kwargs):
    guard("getaddrinfo", host)
    return real_getaddrinfo(host, *args, **kwargs)

def address_host(sock, address):
    return address[0] if sock.family in (socket.AF_INET, socket.AF_INET6) else None

def connect(self, address):
    guard("connect", address_host(self, address))
    return real_connect(self, address)

def connect_ex(self, address):
    guard("connect", address_host(self, address))
    return real_connect_ex(self, address)

def sendto(self, data, *rest):
    guard("sendto", address_host(self, rest[-1]))
    return real_sendto(self, data, *rest)

socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto = (
    getaddrinfo, connect, connect_ex, sendto)
socket.gethostbyname = lambda host: guard("gethostbyname", host) or "127.0.0.1"

from llmkit.cli.app import main

codes = []
for args in json.loads(sys.argv[1]):
    try:
        main(args)
        codes.append(0)
    except SystemExit as e:
        codes.append(e.code or 0)
offline = {}
if "huggingface_hub" in sys.modules:
    constants = sys.modules["huggingface_hub"].constants
    offline.update(hub_offline=constants.HF_HUB_OFFLINE, telemetry_off=constants.HF_HUB_DISABLE_TELEMETRY)
if "datasets" in sys.modules:
    offline["datasets_offline"] = sys.modules["datasets"].config.HF_DATASETS_OFFLINE
print("GUARD " + json.dumps({"codes": codes, "attempts": attempts, "offline": offline}))
"""

SWITCHES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY",
            "DISABLE_TELEMETRY", "DO_NOT_TRACK", "USE_HUB_KERNELS")


def run_guarded(commands: list[list[str]], home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES and not k.startswith("LLMKIT_KILL")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), HF_HOME=str(home / ".cache/huggingface"),
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", GUARDED, json.dumps(commands)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    report = [line for line in done.stdout.splitlines() if line.startswith("GUARD ")]
    assert report, done.stdout[-3000:] + done.stderr[-3000:]
    return {**json.loads(report[-1][len("GUARD "):]), "stderr": done.stderr}


@pytest.mark.slow  # one process: LoRA training, generation, lm-eval and export (~40 s)
def test_the_quick_start_on_a_lora_run_opens_no_socket_but_loopback(tmp_path, tok):
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "pretrain", tiny_model(tok.vocab_size, max_seq_len=256), tok)
    write_dataset(ws, "sft_train", addition_rows(8))
    sets = [a for pair in ("max_steps=1", "micro_batch_size=4", "seq_len=64", "eval_every=0", "eval_records=0",
                           "warmup_steps=0", "lora.r=4", "lora.alpha=8") for a in ("--set", pair)]
    w = ["-w", str(ws)]
    commands = [["sft", "--from", "pretrain", *w, *sets],
                ["generate", "--from", "sft", "--prompt", "What is 12+34?", "--set", "max_new_tokens=2", *w],
                ["eval", "--from", "sft", "--tasks", "mmlu_reversal", "--set", "harness.limit=2", *w],
                ["export", "--from", "sft", *w]]
    home = tmp_path / "home"
    home.mkdir()
    got = run_guarded(commands, home)
    assert got["codes"] == [0, 0, 0, 0], got["stderr"][-3000:]
    assert got["attempts"] == []
    assert got["offline"] == {"hub_offline": True, "telemetry_off": True, "datasets_offline": True}
    assert "kernels-community" not in got["stderr"]  # no warning about a hub kernel it may not fetch


def test_the_offline_switches_are_set_before_any_command_runs_and_a_users_own_value_wins(monkeypatch):
    from llmkit.cli.app import OFFLINE, build_app

    for name in OFFLINE:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    build_app()
    assert os.environ["HF_HUB_OFFLINE"] == "0"
    assert {k: os.environ[k] for k in ("TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY")} \
        == {"TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
