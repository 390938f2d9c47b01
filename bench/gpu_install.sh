#!/usr/bin/env bash
# On the GPU machine (no network): install llmkit and what it lacks from gpu-wheels/ (made by
# bench/gpu_wheels.sh), without dependency resolution, so the machine's torch is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install -q --no-index --no-deps gpu-wheels/deps/*.whl gpu-wheels/*.whl
"$PYTHON" -c "import torch, deepspeed, llmkit; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'deepspeed', deepspeed.__version__)"
