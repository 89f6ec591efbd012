#!/usr/bin/env bash
# SIGKILL and resume under training.precision: fp16 with dynamic loss scaling: the scaler's
# state (scale, clean-step count, hysteresis, skipped counts) is in every checkpoint, so a
# resumed run continues bit for bit. Every run (the uninterrupted references and each trial)
# overflows at step 3 (FT_TEST_NAN_GRAD_AT_STEP: a NaN in a gradient, as an fp16 overflow
# gives), which skips that step; the scale doubles every 3 clean steps. 6 trials of
# test_ckpt_crash.sh, each resumed run's losses, grad norms, eval losses and final checkpoint
# identical to the uninterrupted run's.
#   bash tests/cli/test_ckpt_crash_fp16.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
export FT_TEST_NAN_GRAD_AT_STEP=3
FT_CRASH_PRECISION=fp16 FT_CRASH_TRAINING="loss_scale_window: 3, loss_scale_hysteresis: 1" \
  FT_CRASH_TRIALS=6 FT_CRASH_KEEP_LAST=0 exec bash "$2/tests/cli/test_ckpt_crash.sh" "$1" "$2"
