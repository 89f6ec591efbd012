// Token embedding lookup and its gradient on the CPU (vocabulary-parallel shards).
// Loops over rows run under OpenMP with static schedules, so results are bit-identical from run
// to run for a fixed thread count (resume tests rely on this).
#include <cstring>

#include "kernels/kernels.h"

namespace ft::kernels {

void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                       int v_begin, int v_count) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const int row = ids[n] - v_begin;
    if (v_count < 0 || (row >= 0 && row < v_count))
      std::memcpy(out + size_t(n) * C, table + size_t(row) * C, sizeof(float) * C);
    else
      std::memset(out + size_t(n) * C, 0, sizeof(float) * C);
  }
}

void embedding_backward(float* dtable, const int32_t* ids, const float* dout, int N, int C,
                        int v_begin, int v_count) {
  // Parallel over columns: each thread owns a column range, rows stay in order, so duplicate
  // ids accumulate in the same order every time.
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 64) {
    int c1 = c0 + 64 < C ? c0 + 64 : C;
    for (int n = 0; n < N; ++n) {
      const int row = ids[n] - v_begin;
      if (v_count >= 0 && (row < 0 || row >= v_count)) continue;
      float* dst = dtable + size_t(row) * C;
      const float* src = dout + size_t(n) * C;
      for (int c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace ft::kernels
