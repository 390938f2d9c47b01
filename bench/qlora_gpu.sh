#!/usr/bin/env bash
# QLoRA on a GPU against the same run on the CPU (issue #32): nf4 base + adamw8bit, the first
# 20 steps' losses of both must agree to 1e-2 (bitsandbytes' CUDA and CPU nf4 kernels differ in
# summation order, not in the quantised weights). One script, so a lent GPU's minutes measure.
#
#   bench/qlora_gpu.sh WS [FROM] [DATA]     # WS holds FROM (a model run) and DATA (sft rows)
#
# WS defaults to workspace-smollm2 (SmolLM2-135M-Instruct, `make smollm2`; its GGUF is 98 MB, over
# the device's 64 MiB carry: build the workspace there from the wheel cache, or pass the demo
# workspace and FROM=sft). Needs bitsandbytes with CUDA kernels on the GPU machine
# (bench/gpu_wheels.sh + bench/gpu_install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
WS=${1:-workspace-smollm2}
FROM=${2:-smollm2}
DATA=${3:-sft_mix}
LLMKIT=${LLMKIT:-.venv/bin/llmkit}
PYTHON=${PYTHON:-.venv/bin/python}
FLAGS=(--from "$FROM" --in "$DATA" -w "$WS" --force
       --set lora.r=16 --set lora.alpha=32 --set lora.quant=nf4 --set optim=adamw8bit
       --set max_steps=20 --set log_every=1 --set eval_every=0 --set seq_len=64 --set micro_batch_size=4
       --set warmup_steps=5 --set lr=5e-4 --set seed=0)

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
CUDA_VISIBLE_DEVICES="" "$LLMKIT" sft "${FLAGS[@]}" --out qlora-cpu > /dev/null
"$LLMKIT" sft "${FLAGS[@]}" --out qlora-gpu > /dev/null
"$PYTHON" - "$WS" <<'EOF'
import json, sys
from pathlib import Path
ws = Path(sys.argv[1])
def losses(run):
    return [json.loads(line)["loss"] for line in (ws / run / "metrics.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)][:20]
cpu, gpu = losses("qlora-cpu"), losses("qlora-gpu")
worst = max(abs(a - b) for a, b in zip(cpu, gpu))
for step, (a, b) in enumerate(zip(cpu, gpu), 1):
    print(f"step {step:2d}  cpu {a:.5f}  gpu {b:.5f}  diff {abs(a - b):.2e}")
print(f"steps {len(cpu)}/{len(gpu)}, max |loss diff| {worst:.2e} (goal <= 1e-2):",
      "PASS" if len(cpu) == len(gpu) == 20 and worst <= 1e-2 else "FAIL")
EOF
