#!/usr/bin/env bash
# GPU numbers: tokens/s of plain vs speculative decoding on the native runner; one JSON line (scripts/gpu_bench.py).
# Needs only a Python with torch (CUDA build) and numpy; installs nothing. From any directory:
#   scripts/gpu_bench.sh                                       # CUDA, bf16
#   scripts/gpu_bench.sh --device cpu --dtype float32 --tiny   # smoke test
#   PYTHON=.venv/bin/python scripts/gpu_bench.sh ...           # another interpreter (default: python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" scripts/gpu_bench.py "$@"
