// kernels.h's per-instruction-set kernels: each call runs the copy of the level cpu_isa() chose
// (isa.h says how the copies are built). Compiled once, with the baseline flags. One switch per
// call (a load and a predictable branch, nothing beside the kernels' own work).
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/isa_levels.h"
#include "kernels/kernels.h"

namespace ft::kernels {

// Returns CALL (a kernel call, arguments named as in the caller) from the chosen level's copy.
// avx512, avx512_bf16 and amx share level 2's copy (isa.h).
#define FT_DISPATCH(CALL)      \
  switch (cpu_isa()) {         \
    case CpuIsa::amx:          \
    case CpuIsa::avx512_bf16:  \
    case CpuIsa::avx512:       \
      return isa_avx512::CALL; \
    case CpuIsa::avx2:         \
      return isa_avx2::CALL;   \
    case CpuIsa::baseline:     \
      break;                   \
  }                            \
  return isa_baseline::CALL

// kernels.h's entry point for each entry of isa_kernels.inc, forwarding to the chosen level.
#define FT_CPU_ISA_TEMPLATE(TYPE, RETURN, NAME, PARAMETERS, ARGUMENTS) \
  template <typename TYPE>                                             \
  RETURN NAME PARAMETERS {                                             \
    FT_DISPATCH(NAME<TYPE> ARGUMENTS);                                 \
  }
#define FT_CPU_ISA_KERNEL(RETURN, NAME, PARAMETERS, ARGUMENTS) \
  RETURN NAME PARAMETERS { FT_DISPATCH(NAME ARGUMENTS); }
#include "kernels/cpu/isa_kernels.inc"
#undef FT_CPU_ISA_TEMPLATE
#undef FT_CPU_ISA_KERNEL
#undef FT_DISPATCH

// Every level's copy is instantiated for these three (kernels.h); so are the entry points, one
// line each for the templates of isa_kernels.inc.
#define FT_INSTANTIATE(T)                                                                          \
  template void bias_add(T*, const T*, int, int);                                                  \
  template void bias_grad(float*, const T*, int, int);                                             \
  template void embedding_forward(T*, const int32_t*, const T*, int, int, int, int);               \
  template void embedding_backward(float*, const int32_t*, const T*, int, int, int, int);          \
  template void rmsnorm_forward(T*, float*, const T*, const T*, int, int, float);                  \
  template void rmsnorm_backward(T*, float*, const T*, const T*, const T*, const float*, int, int, \
                                 bool);                                                            \
  template void rope_forward(T*, const float*, int, int, int, int, const int32_t*);                \
  template void rope_backward(T*, const float*, int, int, int, int, const int32_t*);               \
  template void attention_forward<T>(T*, float*, const T*, const T*, const T*, int, int, int, int, \
                                     int, const int32_t*);                                         \
  template size_t attention_backward_scratch_elems<T>(int, int, int, int);                         \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const float*, const T*,      \
                                      const T*, const T*, float*, int, int, int, int, int,         \
                                      const int32_t*);                                             \
  template void attention_decode(T*, const T*, const T*, const T*, int, int, int, int, int);       \
  template void swiglu_forward(T*, const T*, const T*, size_t);                                    \
  template void swiglu_backward(T*, T*, const T*, const T*, const T*, size_t);                     \
  template double cross_entropy_forward_backward<T>(T*, const T*, const int32_t*, const uint8_t*,  \
                                                    int, int, float);                              \
  template void row_max(float*, const T*, int, int);                                               \
  template void ce_partial(double*, double*, const T*, const int32_t*, const uint8_t*,             \
                           const float*, int, int, int);                                           \
  template double ce_finish<T>(T*, const T*, const int32_t*, const uint8_t*, const float*,         \
                               const double*, const double*, int, int, int, float);                \
  template void add_inplace(T*, const T*, size_t);                                                 \
  template void accumulate(float*, const T*, size_t);                                              \
  template void dropout_scale(T*, const T*, size_t, size_t, size_t, float, float, uint64_t);       \
  template void quantize_nf4(uint8_t*, float*, const T*, size_t);                                  \
  template void dequantize_nf4(T*, const uint8_t*, const int8_t*, const float*, float, size_t);    \
  template void adamw_update(float*, const float*, float*, float*, size_t, const AdamwStep&, T*,   \
                             float);                                                               \
  template bool gemm16_packed(bool, bool, int, int, int, const T*, const T*, T*, float*, bool);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

template void convert(bf16*, const float*, size_t);
template void convert(f16*, const float*, size_t);
template void convert(float*, const bf16*, size_t);
template void convert(float*, const f16*, size_t);

}  // namespace ft::kernels
