// Per-instruction-set compilation of the CPU kernels. Internal to kernels/cpu/.
//
// The kernel sources (all of kernels/cpu/*.cpp but gemm.cpp, gemm_onednn.cpp, dispatch.cpp and
// cpu_isa.cpp) are compiled once per level of CpuIsa (kernels.h), CMakeLists.txt defining
// FT_CPU_ISA_LEVEL; each copy lives in its own namespace, ft::kernels::FT_CPU_ISA_NS, and
// dispatch.cpp calls the copy of the level chosen at run time. Every file is compiled with the
// build's baseline flags (no -march: the compiler's x86-64 default, as the rest of ft); a level's
// code gets its instructions from a `#pragma GCC target` region (FT_CPU_ISA_BEGIN … FT_CPU_ISA_END)
// around the functions that the file and the headers below define, rather than from -m flags on the
// whole file. So the functions a kernel file instantiates from the C++ library (std::vector's, say:
// weak symbols the linker keeps one copy of, from whichever object comes first) stay baseline code,
// and no baseline caller can land in an AVX-512 copy of them. Inline helpers defined inside a
// region (half_vec.h, vec_math.h, thread_sums.h) are in the level's namespace for the same reason.
//
// Inside a region GCC (in C++) does not define __AVX2__, __AVX512F__ …, so code chooses its
// intrinsics by FT_CPU_ISA_LEVEL: 0 baseline, 1 avx2 (the x86-64-v3 set: AVX2, FMA, F16C, BMI1/2,
// LZCNT, MOVBE), 2 avx512 (x86-64-v4: AVX-512 F/BW/CD/DQ/VL). The avx512_bf16 and amx levels of
// CpuIsa (kernels.h) run level 2's copy: what they add is the GEMM libraries'.
#pragma once

#if !defined(FT_CPU_ISA_LEVEL)
#error \
    "kernels/cpu/: this file is compiled once per instruction set (FT_CPU_ISA_LEVEL, CMakeLists.txt)"
#endif

// The feature lists are kept on one line each: _Pragma takes a single string literal.
// clang-format off
#if FT_CPU_ISA_LEVEL == 0
#define FT_CPU_ISA_NS isa_baseline
#define FT_CPU_ISA_BEGIN
#define FT_CPU_ISA_END
#elif FT_CPU_ISA_LEVEL == 1
#define FT_CPU_ISA_NS isa_avx2
#if defined(__clang__)
#define FT_CPU_ISA_BEGIN _Pragma("clang attribute push(__attribute__((target(\"sse3,ssse3,sse4.1,sse4.2,popcnt,avx,avx2,bmi,bmi2,f16c,fma,lzcnt,movbe\"))), apply_to = function)")
#define FT_CPU_ISA_END _Pragma("clang attribute pop")
#else
#define FT_CPU_ISA_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"sse3,ssse3,sse4.1,sse4.2,popcnt,avx,avx2,bmi,bmi2,f16c,fma,lzcnt,movbe\")")
#define FT_CPU_ISA_END _Pragma("GCC pop_options")
#endif
#elif FT_CPU_ISA_LEVEL == 2
#define FT_CPU_ISA_NS isa_avx512
#if defined(__clang__)
#define FT_CPU_ISA_BEGIN _Pragma("clang attribute push(__attribute__((target(\"sse3,ssse3,sse4.1,sse4.2,popcnt,avx,avx2,bmi,bmi2,f16c,fma,lzcnt,movbe,avx512f,avx512bw,avx512cd,avx512dq,avx512vl\"))), apply_to = function)")
#define FT_CPU_ISA_END _Pragma("clang attribute pop")
#else
#define FT_CPU_ISA_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"sse3,ssse3,sse4.1,sse4.2,popcnt,avx,avx2,bmi,bmi2,f16c,fma,lzcnt,movbe,avx512f,avx512bw,avx512cd,avx512dq,avx512vl\")")
#define FT_CPU_ISA_END _Pragma("GCC pop_options")
#endif
#else
#error "FT_CPU_ISA_LEVEL must be 0, 1 or 2"
#endif
// clang-format on
