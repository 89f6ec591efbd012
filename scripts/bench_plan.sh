#!/usr/bin/env bash
# How long `ft plan` takes to count a Llama-3-70B shape on 64 ranks (8 tensor × 4 pipeline × 2
# data, bf16, ZeRO-1, activation checkpointing, seq 8192, CUDA): each rank's setup and one step
# run on the counting device (DESIGN.md §4). Prints the wall time and peak RSS of three runs.
# A benchmark, not a test: machines are shared and noisy.
#   scripts/bench_plan.sh [BUILD_DIR]
set -euo pipefail
build="${1:-build}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/l70.yaml" <<YAML
run: {name: llama3-70b, output_dir: $tmp/out, seed: 1}
model: {dim: 8192, n_layers: 80, n_heads: 64, n_kv_heads: 8, ffn_dim: 28672, vocab_size: 128256,
        max_seq_len: 8192, rope_theta: 500000}
data: {train: $tmp/nowhere, seq_len: 8192}
training: {micro_batch_size: 1, global_batch_size: 64, precision: bf16,
           activation_checkpointing: true}
parallel: {tensor: 8, pipeline: 4, zero_stage: 1}
runtime: {device: cuda}
YAML
for i in 1 2 3; do
  /usr/bin/time -f "bench_plan: run $i: %e s wall, %M KiB peak RSS" \
    "$build/ft" plan "$tmp/l70.yaml" --world 64 > "$tmp/plan.txt"
done
grep -m1 '^model:' "$tmp/plan.txt"
grep -E '^ranks|  total ' "$tmp/plan.txt"
