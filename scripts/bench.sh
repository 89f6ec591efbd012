#!/usr/bin/env bash
# Speed baseline (not a CI test): ft and PyTorch tokens/s and GFLOP/s on the bench shape
# (dim 512, 8 layers, 8 heads, ffn 1408, vocab 32000, seq 256, micro-batch 4, fp32, one process).
#   scripts/bench.sh [--steps N] [--threads N] [--skip-torch] [--data-parallel N] [--tensor-parallel N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ -x build/ft ]] || scripts/setup.sh --no-data
exec /usr/bin/python3 scripts/bench.py --ft build/ft "$@"
