// Every instruction-set level's copy of the kernels (isa.h says how the copies are built), each
// declared in its own namespace as the level's objects define it: what dispatch.cpp forwards to,
// and what tests/unit/test_cpu_isa.cpp calls level by level. Internal to kernels/cpu/ and its
// tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/kernels.h"

// Each entry of isa_kernels.inc as a declaration.
#define FT_CPU_ISA_TEMPLATE(TYPE, RETURN, NAME, PARAMETERS, ARGUMENTS) \
  template <typename TYPE>                                             \
  RETURN NAME PARAMETERS;
#define FT_CPU_ISA_KERNEL(RETURN, NAME, PARAMETERS, ARGUMENTS) RETURN NAME PARAMETERS;

namespace ft::kernels {
namespace isa_baseline {
#include "kernels/cpu/isa_kernels.inc"
}  // namespace isa_baseline
namespace isa_avx2 {
#include "kernels/cpu/isa_kernels.inc"
}  // namespace isa_avx2
namespace isa_avx512 {
#include "kernels/cpu/isa_kernels.inc"
}  // namespace isa_avx512
}  // namespace ft::kernels

#undef FT_CPU_ISA_TEMPLATE
#undef FT_CPU_ISA_KERNEL
