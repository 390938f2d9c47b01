#!/usr/bin/env bash
# Build, on this machine (network to PyPI), the wheels the lent GPU machine lacks, so that its
# first minutes measure instead of installing. That machine has Python 3.12, torch with CUDA,
# transformers, peft, pyarrow, sentencepiece, typer, rich, numba and tensorboard, no network,
# and none of deepspeed, datasketch, jieba, zstandard, rouge-score, pydantic or hjson.
#
#   bench/gpu_wheels.sh      # -> gpu-wheels/ (git-ignored, ~25 MB: carry it to the device)
#   there: bench/gpu_install.sh && PYTHON=python3 bench/pretrain_gpu.sh
#
# Left out to stay under the device's 64 MiB carry: scipy (datasketch's, for bench/dedup.py's
# peer only) and lxml (sacrebleu's); nothing on the GPU benchmarks' path imports them.
#
# Binary wheels are for CPython 3.12 on manylinux x86_64; deepspeed is a source package and is
# built as a pure wheel with no compiled ops (DS_BUILD_OPS=0: its CUDA ops JIT-build on first use,
# and llmkit passes a torch optimizer so none is needed).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT_DIR:-gpu-wheels}
PY=${GPU_PYTHON_VERSION:-3.12}
rm -rf "$OUT" && mkdir -p "$OUT"

# llmkit itself, pure
"$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" .
# deepspeed from source, pure
DS_BUILD_OPS=0 "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "deepspeed==0.19.8"
# the rest, with the dependencies the GPU machine may lack, for its Python; torch and the CUDA
# libraries are left out (the machine's own build stays)
"$PYTHON" -m pip download -q --only-binary=:all: --python-version "$PY" \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
    --implementation cp -d "$OUT/deps" --no-deps \
    datasketch zstandard pydantic pydantic-core annotated-types typing-inspection hjson \
    py-cpuinfo msgpack ninja einops absl-py nltk sacrebleu portalocker tabulate colorama psutil
# jieba and rouge-score publish sources only: pure wheels built here
"$PYTHON" -m pip wheel -q --no-deps -w "$OUT/deps" jieba rouge-score
ls "$OUT" "$OUT/deps"
du -sh "$OUT"
