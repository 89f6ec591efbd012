// SwiGLU activation h = silu(g) * u and its gradient on the CPU.
// Elementwise under OpenMP with static schedules: bit-identical from run to run. 16-bit inputs
// are staged in fp32 a block at a time (kernels/cpu/half_vec.h), outputs rounded once. The
// sigmoid is vec_math.h's (a libm exp per element kept these loops scalar: 6% of a bf16 step).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

namespace {
// Elements per staged block: 3-5 fp32 blocks stay in L1 beside the 16-bit data.
constexpr size_t kBlock = 512;
}  // namespace

template <typename T>
void swiglu_forward(T* h, const T* g, const T* u, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    float gbuf[cpu::staging<T>(kBlock) + 1], ubuf[cpu::staging<T>(kBlock) + 1],
        hbuf[cpu::staging<T>(kBlock) + 1];
    const float* gf = cpu::in_f32(g + b, m, gbuf);
    const float* uf = cpu::in_f32(u + b, m, ubuf);
    float* hf = cpu::out_f32(h + b, hbuf);
    for (size_t i = 0; i < m; ++i) {
      const float s = cpu::sigmoid(gf[i]);
      hf[i] = gf[i] * s * uf[i];
    }
    cpu::store_out(h + b, hf, m);
  }
}

template <typename T>
void swiglu_backward(T* dg, T* du, const T* dh, const T* g, const T* u, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    constexpr size_t kStage = cpu::staging<T>(kBlock) + 1;
    float dhbuf[kStage], gbuf[kStage], ubuf[kStage], dgbuf[kStage], dubuf[kStage];
    const float* dhf = cpu::in_f32(dh + b, m, dhbuf);
    const float* gf = cpu::in_f32(g + b, m, gbuf);
    const float* uf = cpu::in_f32(u + b, m, ubuf);
    float* dgf = cpu::out_f32(dg + b, dgbuf);
    float* duf = cpu::out_f32(du + b, dubuf);
    for (size_t i = 0; i < m; ++i) {
      const float s = cpu::sigmoid(gf[i]);
      float silu = gf[i] * s;
      duf[i] = dhf[i] * silu;
      dgf[i] = dhf[i] * uf[i] * s * (1.0f + gf[i] * (1.0f - s));
    }
    cpu::store_out(dg + b, dgf, m);
    cpu::store_out(du + b, duf, m);
  }
}

#define FT_INSTANTIATE(T)                                       \
  template void swiglu_forward(T*, const T*, const T*, size_t); \
  template void swiglu_backward(T*, T*, const T*, const T*, const T*, size_t);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
