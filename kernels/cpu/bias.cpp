// Bias add and its gradient on the CPU (Qwen2's q, k, v projections have biases).
// bias_add is elementwise over rows; bias_grad sums each column's rows in row order, in fp32,
// whatever the thread count: each thread owns a range of columns and walks every row, so the
// bits depend only on the inputs (and the CUDA kernel, summing in the same order when there
// are few rows, gives the same bits there).
#include <algorithm>
#include <vector>

#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

namespace {
constexpr int kCols = 64;  // columns per thread's share: an fp32 row segment of 256 bytes
}  // namespace

template <typename T>
void bias_add(T* y, const T* b, int N, int C) {
  if (N <= 0 || C <= 0) return;
  std::vector<float> bbuf(cpu::staging<T>(size_t(C)));
  const float* bf = cpu::in_f32(b, size_t(C), bbuf.data());
#pragma omp parallel
  {
    std::vector<float> buf(cpu::staging<T>(size_t(C)));
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      T* row = y + size_t(n) * C;
      const float* yf = cpu::in_f32(row, size_t(C), buf.data());
      float* of = cpu::out_f32(row, buf.data());
      for (int c = 0; c < C; ++c) of[c] = yf[c] + bf[c];  // y + b in fp32, rounded once
      cpu::store_out(row, of, size_t(C));
    }
  }
}

template <typename T>
void bias_grad(float* db, const T* dy, int N, int C) {
  if (N <= 0 || C <= 0) return;
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kCols) {
    const int m = std::min(kCols, C - c0);
    float sum[kCols] = {};
    float buf[cpu::staging<T>(kCols) + 1];
    for (int n = 0; n < N; ++n) {
      const float* d = cpu::in_f32(dy + size_t(n) * C + c0, size_t(m), buf);
      for (int j = 0; j < m; ++j) sum[j] += d[j];
    }
    for (int j = 0; j < m; ++j) db[c0 + j] += sum[j];
  }
}

#define FT_INSTANTIATE(T)                         \
  template void bias_add(T*, const T*, int, int); \
  template void bias_grad(float*, const T*, int, int);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
