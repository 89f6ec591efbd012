// hopper_kernels.cu compiled by g++ against the CUDA emulation (a test tool), as
// warp_matrix_kernels_emu.cpp does for its kernels: the emulation's header first, then the .cu.
#include "tests/cuda_emu/cuda_emu.h"

#include "tests/cuda_emu/hopper_kernels.cu"
