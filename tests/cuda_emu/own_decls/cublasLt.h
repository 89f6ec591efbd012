// <cublasLt.h> where the CUDA toolkit is not installed: the emulated cuBLASLt's own
// declarations (a test tool; tests/CMakeLists.txt puts this folder on the include path only then).
#pragma once
#include "tests/cuda_emu/cublaslt_decls.h"
