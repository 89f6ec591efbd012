// Generation with a KV cache on the CPU (kernels.h "decode.cpp"): attention of a few new queries
// over the cached keys and values (RoPE at the cache's positions is rope_forward's, rope.cpp). One
// sequence; the work per new token is O(position · H · D), so plain loops over (query, head) under
// OpenMP suffice.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

template <typename E>
void attention_decode(E* out, const E* q, const E* k, const E* v, int pos, int Tq, int H, int K,
                      int D) {
  const int group = H / K;
  const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel
  {
    // Rows of a 16-bit cache are converted through half_vec.h (to_f32's bits, vectorised).
    std::vector<float> p(static_cast<size_t>(pos + Tq)), acc(static_cast<size_t>(D)),
        qf(static_cast<size_t>(D)), row(static_cast<size_t>(D));
#pragma omp for collapse(2) schedule(static)
    for (int t = 0; t < Tq; ++t)
      for (int h = 0; h < H; ++h) {
        const int g = h / group, last = pos + t;  // keys 0 .. last
        const E* qh = q + (size_t(t) * H + h) * D;
        const float* qv = cpu::in_f32(qh, size_t(D), qf.data());
        float m = -INFINITY;
        for (int j = 0; j <= last; ++j) {
          const float* kj = cpu::in_f32(k + (size_t(j) * K + g) * D, size_t(D), row.data());
          float sdot = 0;
          for (int d = 0; d < D; ++d) sdot += qv[d] * kj[d];
          p[size_t(j)] = sdot * scale;
          m = std::max(m, p[size_t(j)]);
        }
        float sum = 0;
        for (int j = 0; j <= last; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - m));
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int j = 0; j <= last; ++j) {
          const float* vj = cpu::in_f32(v + (size_t(j) * K + g) * D, size_t(D), row.data());
          for (int d = 0; d < D; ++d) acc[size_t(d)] += p[size_t(j)] * vj[d];
        }
        E* oh = out + (size_t(t) * H + h) * D;
        for (int d = 0; d < D; ++d) acc[size_t(d)] /= sum;
        if constexpr (std::is_same_v<E, float>)
          std::copy(acc.begin(), acc.end(), oh);
        else
          cpu::store_f32(oh, acc.data(), size_t(D));
      }
  }
}

#define FT_INSTANTIATE(E) \
  template void attention_decode(E*, const E*, const E*, const E*, int, int, int, int, int);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
