// AdamW optimizer step on the CPU.
// Elementwise under OpenMP with static schedules, so results are bit-identical from run to run
// for a fixed thread count (resume tests rely on this).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/adamw_step.h"
#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

namespace {
// The element update on [lo, hi): the one place AdamW's arithmetic is written.
inline void adamw_range(float* p, const float* g, float* m, float* v, size_t lo, size_t hi,
                        const AdamwStep& k, float grad_scale) {
  for (size_t i = lo; i < hi; ++i) {
    const float gi = g[i] * grad_scale;  // rounded as scale_inplace would store it
    float pi = p[i] * k.decay;
    float mi = m[i] * k.beta1 + (1.0f - k.beta1) * gi;
    float vi = v[i] * k.beta2 + (1.0f - k.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    p[i] = pi - k.step_size * (mi / denom);
  }
}

// Elements per block of the fused update: the block's new p is still in L1 when it is cast.
constexpr size_t kBlock = 2048;
}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamwStep& k,
                  float grad_scale) {
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < n; b += kBlock)
    adamw_range(p, g, m, v, b, std::min(b + kBlock, n), k, grad_scale);
}

template <typename T>
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamwStep& k,
                  T* p_compute, float grad_scale) {
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(b + kBlock, n);
    adamw_range(p, g, m, v, b, e, k, grad_scale);
    if constexpr (std::is_same_v<T, float>)
      std::memcpy(p_compute + b, p + b, sizeof(float) * (e - b));
    else
      cpu::store_f32(p_compute + b, p + b, e - b);
  }
}

template void adamw_update(float*, const float*, float*, float*, size_t, const AdamwStep&, float*,
                           float);
template void adamw_update(float*, const float*, float*, float*, size_t, const AdamwStep&, bf16*,
                           float);
template void adamw_update(float*, const float*, float*, float*, size_t, const AdamwStep&, f16*,
                           float);

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
