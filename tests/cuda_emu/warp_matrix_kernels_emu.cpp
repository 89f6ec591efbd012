// warp_matrix_kernels.cu compiled by g++ against the CUDA emulation (a test tool): the emulated
// build's header first, as the kernels' force-include does, then the kernels as C++. A file of
// its own because CMake's LANGUAGE property is per directory, and nvcc compiles the same .cu for
// ft_cuda_kernel_tests.
#include "tests/cuda_emu/cuda_emu.h"

#include "tests/cuda_emu/warp_matrix_kernels.cu"
