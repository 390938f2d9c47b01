"""`python tests/cli/peak_rss.py WS ARGS...`: the resident memory a training command adds at its
peak, measured in this fresh process. Prints JSON {"baseline": bytes, "peak": bytes, "growth": bytes}.

How: a first tiny run (`--out rss_warmup`, a 2-layer 16-wide model, 2 steps) loads every library and
makes the one-time allocations (torch's thread pools, DeepSpeed, the CPU peak-FLOP/s probe); then the
resident set size (VmRSS) is read as the baseline, Linux's high-water mark is reset (`5` written to
/proc/self/clear_refs), the command `llmkit ARGS` runs in this process, and the growth is the new high
water mark (VmHWM) minus the baseline: weights, gradients, optimizer state, activations, the loss and
the checkpoint save, as the CPU allocator gets them from the system.
"""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def run(args: list[str]) -> None:
    from llmkit.cli.app import main

    try:
        main(args)
    except SystemExit as e:
        if e.code:
            raise


def main(ws: str, args: list[str]) -> dict:
    tiny = [f"model.{k}={v}" for k, v in dict(preset="tiny", hidden_size=16, n_layers=2, n_heads=2,
                                               n_kv_heads=1, intermediate_size=32, max_seq_len=16).items()]
    run(["pretrain", "-w", ws, "--out", "rss_warmup", "--force", "--set", "max_steps=2", "seq_len=16",
         "micro_batch_size=2", "eval_every=0", *tiny])
    baseline = status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    run(args)
    peak = status_kib("VmHWM")
    return {"baseline": baseline, "peak": peak, "growth": peak - baseline}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
