#!/usr/bin/env bash
# SIGKILL and resume under training.precision: bf16 (fp32 masters and moments are what a
# checkpoint holds; the bf16 compute copy is rounded from them on resume): 6 trials of
# test_ckpt_crash.sh, each resumed run's losses, grad norms, eval losses and final checkpoint
# identical to the uninterrupted bf16 run's.
#   bash tests/cli/test_ckpt_crash_bf16.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
FT_CRASH_PRECISION=bf16 FT_CRASH_TRIALS=6 FT_CRASH_KEEP_LAST=0 \
  exec bash "$2/tests/cli/test_ckpt_crash.sh" "$1" "$2"
