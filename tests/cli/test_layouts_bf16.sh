#!/usr/bin/env bash
# Every axis of the layout matrix and every ZeRO stage under training.precision: bf16 (bf16
# compute copy and activations, fp32 masters, moments and gradient reductions) against the
# one-process bf16 run; bounds and why in tests/ref/compare_layouts.py (BOUNDS["bf16"]).
#   bash tests/cli/test_layouts_bf16.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
exec bash "$2/scripts/test_layouts.sh" --ci --precision bf16 "$1"
