#!/usr/bin/env bash
# training.loss_chunk_tokens on the CUDA backend, executed by the CUDA emulation (ft_emu;
# tests/cli/test_cuda_emu_train.sh says what it is): the head in chunks of 5 tokens trains as in
# one chunk, fp32 and bf16, within tests/cli/test_loss_chunks.sh's bounds (that test, run for
# the emulated device; about 5 s).
#   bash tests/cli/test_cuda_emu_loss_chunks.sh BUILD_DIR SOURCE_DIR
exec bash "$2/tests/cli/test_loss_chunks.sh" "$1" "$2" cuda
