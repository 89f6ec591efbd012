// Rotary position embedding (rotate-half pairing) on the CPU.
// Loops over rows run under OpenMP with static schedules, so results are bit-identical from run
// to run for a fixed thread count (resume tests rely on this).
// 16-bit heads are rotated in fp32 (one head vector staged at a time) and rounded once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

namespace {
// cos/sin tables (T, D/2), computed in float the way HF's rotary embedding does:
// angle = float(t) · inv_freq_i in fp32, then cos and sin of that float. Rows from .. T − 1 are
// (re)computed; rows below `from` are kept (a row depends only on t and inv_freq).
void rope_tables(std::vector<float>& cosv, std::vector<float>& sinv, const float* inv_freq,
                 int from, int T, int D) {
  int half = D / 2;
  cosv.resize(size_t(T) * half);
  sinv.resize(size_t(T) * half);
  for (int i = 0; i < half; ++i) {
    for (int t = from; t < T; ++t) {
      float a = float(t) * inv_freq[i];
      cosv[size_t(t) * half + i] = std::cos(a);
      sinv[size_t(t) * half + i] = std::sin(a);
    }
  }
}

// E: the element type (T is the sequence length here).
template <typename E>
void rope_apply(E* x, const float* inv_freq, const int32_t* pos, int B, int T, int nh, int D,
                float sign) {
  // The tables depend only on inv_freq, which stays fixed through a run, so they are kept (per
  // thread: kernels may be called from several threads later) and only grown when a call needs
  // rows past their end: generation rotates positions pos, pos + 1, ... one token at a time
  // (lib/model/decode.cpp), and rebuilding all pos rows per token would cost O(pos) each. The
  // key is the table's contents, not its address: D/2 floats compare in nanoseconds, and a
  // caller's table may be freed and another allocated at the same address.
  thread_local std::vector<float> cosv, sinv, cached_inv;
  thread_local int cached_T = 0;  // rows the tables hold
  const int half = D / 2;
  // With positions, the table spans 0 .. the largest of them (packed samples: below T).
  int span = T;
  if (pos)
    for (size_t n = 0; n < size_t(B) * T; ++n) span = std::max(span, pos[n] + 1);
  if (cached_inv.size() != size_t(half) ||
      std::memcmp(cached_inv.data(), inv_freq, sizeof(float) * half) != 0) {
    cached_T = 0;
    cached_inv.assign(inv_freq, inv_freq + half);
  }
  if (span > cached_T) {
    rope_tables(cosv, sinv, inv_freq, cached_T, span, D);
    cached_T = span;
  }
  // Plain pointers for the OpenMP threads: inside the loop `cosv` would name *their* copies.
  const float* cos_table = cosv.data();
  const float* sin_table = sinv.data();
#pragma omp parallel
  {
    std::vector<float> buf(cpu::staging<E>(D));
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        const size_t p = pos ? size_t(pos[size_t(b) * T + t]) : size_t(t);
        const float* cs = cos_table + p * half;
        const float* sn = sin_table + p * half;
        for (int h = 0; h < nh; ++h) {
          E* head = x + ((size_t(b) * T + t) * nh + h) * D;
          // float: v is the head itself; 16-bit: an fp32 copy, rounded back below
          float* v = cpu::out_f32(head, buf.data());
          if constexpr (!std::is_same_v<E, float>) cpu::load_f32(v, head, D);
          for (int i = 0; i < half; ++i) {
            // forward: (x1, x2) → (x1 c − x2 s, x2 c + x1 s); backward: the transpose (s → −s)
            float x1 = v[i], x2 = v[i + half];
            float s = sign * sn[i];
            v[i] = x1 * cs[i] - x2 * s;
            v[i + half] = x2 * cs[i] + x1 * s;
          }
          cpu::store_out(head, v, D);
        }
      }
  }
}
}  // namespace

template <typename E>
void rope_forward(E* x, const float* inv_freq, int B, int T, int nh, int D, const int32_t* pos) {
  rope_apply(x, inv_freq, pos, B, T, nh, D, 1.0f);
}
template <typename E>
void rope_backward(E* dx, const float* inv_freq, int B, int T, int nh, int D, const int32_t* pos) {
  rope_apply(dx, inv_freq, pos, B, T, nh, D, -1.0f);
}

#define FT_INSTANTIATE(E)                                                           \
  template void rope_forward(E*, const float*, int, int, int, int, const int32_t*); \
  template void rope_backward(E*, const float*, int, int, int, int, const int32_t*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
