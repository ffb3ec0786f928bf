#!/usr/bin/env bash
# GPU numbers (issue 4, item 5): plain vs speculative decoding, verify pass captured; one JSON line.
# Needs only a Python with torch (CUDA build) and numpy; installs nothing. From any directory:
#   scripts/gpu_bench.sh                                       # CUDA, bf16, torch.compile + CUDA graphs
#   scripts/gpu_bench.sh --device cpu --dtype float32 --tiny   # smoke test
#   PYTHON=.venv/bin/python scripts/gpu_bench.sh ...           # another interpreter (default: python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" scripts/gpu_bench.py "$@"
