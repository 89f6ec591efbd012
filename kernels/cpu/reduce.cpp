// Elementwise accumulate/scale and the squared-norm reduction on the CPU.
// Elementwise loops and the reduction run under OpenMP with static schedules, so results are
// bit-identical from run to run for a fixed thread count (resume tests rely on this; the sum
// goes through cpu::ThreadSums for that).
#include <algorithm>

#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_sums.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

namespace {
constexpr size_t kBlock = 1024;  // elements per staged block (16-bit types) or summed block
}  // namespace

template <typename T>
void add_inplace(T* y, const T* x, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) y[i] += x[i];
  } else {
    // y + x in fp32, one rounding: as torch's bf16/fp16 add
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < n; b += kBlock) {
      const size_t m = std::min(kBlock, n - b);
      float ybuf[kBlock], xbuf[kBlock];
      cpu::load_f32(ybuf, y + b, m);
      cpu::load_f32(xbuf, x + b, m);
      for (size_t i = 0; i < m; ++i) ybuf[i] += xbuf[i];
      cpu::store_f32(y + b, ybuf, m);
    }
  }
}

template <typename T>
void accumulate(float* y, const T* x, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    float xbuf[cpu::staging<T>(kBlock) + 1];
    const float* xf = cpu::in_f32(x + b, m, xbuf);
    for (size_t i = 0; i < m; ++i) y[b + i] += xf[i];
  }
}

void scale_inplace(float* y, float s, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) y[i] *= s;
}

double sum_squares(const float* x, size_t n) {
  cpu::ThreadSums sums;
#pragma omp parallel
  {
    double s = 0.0;
    // blocks of a static schedule, each summed in 16 lanes (vec_math.h): vectorised, and the
    // same order on every run for a given thread count
#pragma omp for schedule(static)
    for (size_t b = 0; b < n; b += kBlock)
      s += cpu::lane_sum_squares_f64(x + b, std::min(kBlock, n - b));
    sums.set(s);
  }
  return sums.total();
}

#define FT_INSTANTIATE(T)                          \
  template void add_inplace(T*, const T*, size_t); \
  template void accumulate(float*, const T*, size_t);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
