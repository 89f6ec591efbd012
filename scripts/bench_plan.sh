#!/usr/bin/env bash
# How long `ft plan` takes to count a Llama-3-70B shape on 64 ranks (recipes/llama3_70b.yaml:
# 8 tensor × 4 pipeline × 2 data, bf16, ZeRO-1, activation checkpointing, seq 8192, CUDA): each
# rank's setup and one step run on the counting device (DESIGN.md §4). Prints the wall time and
# peak RSS of three runs. Run from the repository root.
# A benchmark, not a test: machines are shared and noisy.
#   scripts/bench_plan.sh [BUILD_DIR]
set -euo pipefail
build="${1:-build}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in 1 2 3; do
  /usr/bin/time -f "bench_plan: run $i: %e s wall, %M KiB peak RSS" \
    "$build/ft" plan recipes/llama3_70b.yaml run.output_dir="$tmp/out" --world 64 \
    > "$tmp/plan.txt"
done
grep -m1 '^model:' "$tmp/plan.txt"
grep -E '^ranks|  total ' "$tmp/plan.txt"
