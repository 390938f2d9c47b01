#!/usr/bin/env bash
# GPU benchmark of the training engine (one GPU, ZeRO-0): smol-135m and 1b at seq_len 2048,
# bf16 and fp32 (TF32 matmuls), each without and with activation checkpointing.
# Prints tokens/s, MFU (against the GPU's dense bf16 peak from llmkit.train.metrics) and peak
# GPU memory per configuration. Needs torch with CUDA in .venv (make setup TORCH_SPEC=...).
#
#   bench/pretrain_gpu.sh                       # the full matrix (~5-10 min on an H100/H200)
#   STEPS=30 PRESETS="smol-135m:32" bench/pretrain_gpu.sh
#   EXTRA="--zero-stage 2" bench/pretrain_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
STEPS=${STEPS:-20}
SEQ_LEN=${SEQ_LEN:-2048}
PRESETS=${PRESETS:-"smol-135m:16 1b:4"}
PRECISIONS=${PRECISIONS:-"bf16 fp32"}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# shellcheck disable=SC2086
exec "$PYTHON" bench/pretrain.py --matrix --steps "$STEPS" --seq-len "$SEQ_LEN" \
    --presets $PRESETS --precisions $PRECISIONS ${EXTRA:-}
