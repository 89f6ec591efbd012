#!/usr/bin/env bash
# Speed (not a CI test): ft against PyTorch, interleaved runs, tokens/s, GFLOP/s and memory on the
# bench shape (dim 512, 8 layers, 8 heads, ffn 1408, vocab 32000; seq 256, micro-batch 4 unless
# told; one process). See scripts/bench.py --help.
#   scripts/bench.sh [--precision fp32|bf16|fp16|fp32,bf16,fp16] [--isa baseline|avx2|avx512|avx512_bf16|amx]
#                    [--seq N] [--micro-batch N] [--pairs N] [--steps N] [--threads N]
#                    [--torch-python PATH] [--skip-torch] [--profile]
#                    [--data-parallel N] [--tensor-parallel N]
# Against PyTorch 2.x from PyPI (Debian's 1.13 is the default interpreter's):
#   scripts/bench.sh --precision bf16 --torch-python "$(scripts/bench_torch_venv.sh)"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ -x build/ft ]] || scripts/setup.sh --no-data
exec /usr/bin/python3 scripts/bench.py --ft build/ft "$@"
