// doctest's main for ft_cuda_emu_tests (the CUDA kernels on the CUDA emulation, a test tool).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
