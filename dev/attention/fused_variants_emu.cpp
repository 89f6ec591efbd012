// fused_variants.cu compiled by g++ against the CUDA emulation (tests/cuda_emu/, a test tool): the
// emulation's header first, as the kernels' force-include does, then the variants as C++. A file
// of its own because CMake's LANGUAGE property is per directory, and nvcc compiles the same .cu
// for the native binaries (tests/cuda_emu/warp_matrix_kernels_emu.cpp does the same).
#include "tests/cuda_emu/cuda_emu.h"

#include "dev/attention/fused_variants.cu"
