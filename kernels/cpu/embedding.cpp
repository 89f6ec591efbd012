// Token embedding lookup and its gradient on the CPU (vocabulary-parallel shards).
// Loops over rows run under OpenMP with static schedules, so results are bit-identical from run
// to run for a fixed thread count (resume tests rely on this).
#include <cstring>
#include <vector>

#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int N, int C, int v_begin,
                       int v_count) {
  // A copy of the table's row: no arithmetic, so every T gives the table's bits.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const int row = ids[n] - v_begin;
    if (v_count < 0 || (row >= 0 && row < v_count))
      std::memcpy(out + size_t(n) * C, table + size_t(row) * C, sizeof(T) * C);
    else
      std::memset(out + size_t(n) * C, 0, sizeof(T) * C);
  }
}

template <typename T>
void embedding_backward(float* dtable, const int32_t* ids, const T* dout, int N, int C, int v_begin,
                        int v_count) {
  // Parallel over columns: each thread owns a column range, rows stay in order, so duplicate
  // ids accumulate in the same order every time. dtable stays fp32 (a gradient).
  constexpr int kCols = 64;
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kCols) {
    int c1 = c0 + kCols < C ? c0 + kCols : C;
    float buf[cpu::staging<T>(kCols) + 1];
    for (int n = 0; n < N; ++n) {
      const int row = ids[n] - v_begin;
      if (v_count >= 0 && (row < 0 || row >= v_count)) continue;
      float* dst = dtable + size_t(row) * C + c0;
      const float* src = cpu::in_f32(dout + size_t(n) * C + c0, size_t(c1 - c0), buf);
      for (int c = 0; c < c1 - c0; ++c) dst[c] += src[c];
    }
  }
}

#define FT_INSTANTIATE(T)                                                            \
  template void embedding_forward(T*, const int32_t*, const T*, int, int, int, int); \
  template void embedding_backward(float*, const int32_t*, const T*, int, int, int, int);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
