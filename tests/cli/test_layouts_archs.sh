#!/usr/bin/env bash
# The layouts of scripts/test_layouts.sh for the architectures with tensors of their own
# (DESIGN.md §3, §5): qwen2 (q/k/v biases, split with their weights' rows under tensor
# parallelism) and qwen3 (per-head q/k norms, replicated, their gradient summed over the tensor
# group): tensor 2, pipeline 2 and data 2 with ZeRO-3 against one process, with
# compare_layouts.py's bounds. mistral is Llama's math in the model code (only import differs),
# which tests/cli/test_layouts.sh covers. About 20 s on 2 cores.
#   bash tests/cli/test_layouts_archs.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
for arch in qwen2 qwen3; do
  echo "--- model.arch $arch"
  bash "$2/scripts/test_layouts.sh" --arch "$arch" "$1"
done
