#!/usr/bin/env bash
# The layouts of scripts/test_layouts.sh for the architectures with tensors of their own
# (DESIGN.md §3, §5): qwen2 (q/k/v biases, split with their weights' rows under tensor
# parallelism) and qwen3 (per-head q/k norms, replicated, their gradient summed over the tensor
# group; with head_dim 16, not dim / n_heads = 8): tensor 2, pipeline 2 and data 2 with ZeRO-3
# against one process, with compare_layouts.py's bounds. mistral is Llama's math in the model
# code (only import differs), which tests/cli/test_layouts.sh covers. About 20 s on 2 cores.
#   bash tests/cli/test_layouts_archs.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
echo "--- model.arch qwen2"
bash "$2/scripts/test_layouts.sh" --arch qwen2 "$1"
echo "--- model.arch qwen3, head_dim 16"
bash "$2/scripts/test_layouts.sh" --arch qwen3 --set model.head_dim=16 "$1"
