// Cross-entropy over the vocabulary on the CPU, whole-row and vocabulary-parallel
// (row_max / ce_partial / ce_finish).
// Loops over rows run under OpenMP with static schedules, so results are bit-identical from run
// to run for a fixed thread count (resume tests rely on this); the loss sums go through
// cpu::ThreadSums for that.
// 16-bit logits are staged in fp32 a row at a time (kernels/cpu/half_vec.h): the max, the
// exponentials and the loss are fp32 / double whatever T is; dlogits is rounded once on store.
// Row maxima, exponentials and sums run in 16 lanes (kernels/cpu/vec_math.h): a scalar libm exp
// and a single running double sum made this 8% of a bf16 training step on the bench shape.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_sums.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

namespace {
// Σ body(n, staging) over the rows with mask[n] != 0, under OpenMP with a static schedule and a
// per-thread fp32 staging row (16-bit logits); rows masked out get zero dlogits (if any). The
// rows' values are summed per thread in row order, the threads' sums in thread order.
template <typename T, typename Body>
double sum_masked_rows(T* dlogits, const uint8_t* mask, int N, int V, Body body) {
  cpu::ThreadSums sums;
#pragma omp parallel
  {
    double total = 0.0;
    std::vector<float> buf(cpu::staging<T>(V));
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      if (!mask[n]) {
        if (dlogits) std::memset(dlogits + size_t(n) * V, 0, sizeof(T) * V);
        continue;
      }
      total += body(n, buf.data());
    }
    sums.set(total);
  }
  return sums.total();
}
}  // namespace

template <typename T>
double cross_entropy_forward_backward(std::type_identity_t<T>* dlogits, const T* logits,
                                      const int32_t* targets, const uint8_t* mask, int N, int V,
                                      float scale) {
  return sum_masked_rows(dlogits, mask, N, V, [&](int n, float* buf) {
    T* drow = dlogits ? dlogits + size_t(n) * V : nullptr;
    // 16-bit: l and d are the same fp32 row (the float loop below allows d to alias l)
    const float* l = cpu::in_f32(logits + size_t(n) * V, V, buf);
    float* d = drow ? cpu::out_f32(drow, buf) : nullptr;
    const int t = targets[n];
    const float lt = l[t];  // read before d (which may alias l) is written
    const float mx = cpu::lane_max(l, V, l[0]);
    // exp in float, the sum in double (the sum of V terms is where precision is lost), both
    // vectorised (vec_math.h)
    const double se = cpu::exp_shifted_sum_f64(d, l, size_t(V), mx);
    if (d) {
      const float s = float(double(scale) / se);
      for (int j = 0; j < V; ++j) d[j] *= s;
      d[t] -= scale;
      cpu::store_out(drow, d, V);
    }
    return double(mx) + std::log(se) - double(lt);
  });
}

template <typename T>
void row_max(float* out, const T* x, int N, int V) {
#pragma omp parallel
  {
    std::vector<float> buf(cpu::staging<T>(V));
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* l = cpu::in_f32(x + size_t(n) * V, V, buf.data());
      out[n] = cpu::lane_max(l, V, l[0]);
    }
  }
}

template <typename T>
void ce_partial(double* sumexp, double* target_logit, const T* logits, const int32_t* targets,
                const uint8_t* mask, const float* rmax, int N, int V, int v_begin) {
#pragma omp parallel
  {
    std::vector<float> buf(cpu::staging<T>(V));
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      sumexp[n] = 0.0;
      target_logit[n] = 0.0;
      if (!mask[n]) continue;
      const float* l = cpu::in_f32(logits + size_t(n) * V, V, buf.data());
      sumexp[n] = cpu::exp_shifted_sum_f64(nullptr, l, size_t(V), rmax[n]);
      const int t = targets[n] - v_begin;
      if (t >= 0 && t < V) target_logit[n] = l[t];
    }
  }
}

template <typename T>
double ce_finish(std::type_identity_t<T>* dlogits, const T* logits, const int32_t* targets,
                 const uint8_t* mask, const float* rmax, const double* sumexp,
                 const double* target_logit, int N, int V, int v_begin, float scale) {
  return sum_masked_rows(dlogits, mask, N, V, [&](int n, float* buf) {
    if (T* drow = dlogits ? dlogits + size_t(n) * V : nullptr) {
      // 16-bit: l and d are the same fp32 row; d[j] is written after l[j] is read
      const float* l = cpu::in_f32(logits + size_t(n) * V, V, buf);
      float* d = cpu::out_f32(drow, buf);
      const float s = float(double(scale) / sumexp[n]);
      const float mx = rmax[n];
      for (int j = 0; j < V; ++j) d[j] = cpu::exp_nonpositive(l[j] - mx) * s;
      const int t = targets[n] - v_begin;
      if (t >= 0 && t < V) d[t] -= scale;
      cpu::store_out(drow, d, V);
    }
    return double(rmax[n]) + std::log(sumexp[n]) - target_logit[n];
  });
}

#define FT_INSTANTIATE(T)                                                                         \
  template double cross_entropy_forward_backward<T>(T*, const T*, const int32_t*, const uint8_t*, \
                                                    int, int, float);                             \
  template void row_max(float*, const T*, int, int);                                              \
  template void ce_partial(double*, double*, const T*, const int32_t*, const uint8_t*,            \
                           const float*, int, int, int);                                          \
  template double ce_finish<T>(T*, const T*, const int32_t*, const uint8_t*, const float*,        \
                               const double*, const double*, int, int, int, float);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
