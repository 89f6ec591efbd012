// Cross-entropy over the vocabulary on the CPU, whole-row and vocabulary-parallel
// (row_max / ce_partial / ce_finish).
// Loops over rows run under OpenMP with static schedules, so results are bit-identical from run
// to run for a fixed thread count (resume tests rely on this).
#include <cmath>
#include <cstring>

#include "kernels/kernels.h"

namespace ft::kernels {

double cross_entropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets,
                                      const uint8_t* mask, int N, int V, float scale) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int n = 0; n < N; ++n) {
    const float* l = logits + size_t(n) * V;
    float* d = dlogits ? dlogits + size_t(n) * V : nullptr;
    if (!mask[n]) {
      if (d) std::memset(d, 0, sizeof(float) * V);
      continue;
    }
    const int t = targets[n];
    const float lt = l[t];  // read before d (which may alias l) is written
    float mx = l[0];
    for (int j = 1; j < V; ++j) mx = l[j] > mx ? l[j] : mx;
    // exp in float (vectorised), the sum in double: the sum of V terms is where precision is lost.
    double se = 0.0;
    if (d) {
      for (int j = 0; j < V; ++j) d[j] = std::exp(l[j] - mx);  // d may alias l: l[j] is read first
      for (int j = 0; j < V; ++j) se += d[j];
    } else {
      for (int j = 0; j < V; ++j) se += std::exp(l[j] - mx);
    }
    total += double(mx) + std::log(se) - double(lt);
    if (d) {
      const float s = float(double(scale) / se);
      for (int j = 0; j < V; ++j) d[j] *= s;
      d[t] -= scale;
    }
  }
  return total;
}

void row_max(float* out, const float* x, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* l = x + size_t(n) * V;
    float mx = l[0];
    for (int j = 1; j < V; ++j) mx = l[j] > mx ? l[j] : mx;
    out[n] = mx;
  }
}

void ce_partial(double* sumexp, double* target_logit, const float* logits, const int32_t* targets,
                const uint8_t* mask, const float* rmax, int N, int V, int v_begin) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    sumexp[n] = 0.0;
    target_logit[n] = 0.0;
    if (!mask[n]) continue;
    const float* l = logits + size_t(n) * V;
    double se = 0.0;
    for (int j = 0; j < V; ++j) se += std::exp(l[j] - rmax[n]);
    sumexp[n] = se;
    const int t = targets[n] - v_begin;
    if (t >= 0 && t < V) target_logit[n] = l[t];
  }
}

double ce_finish(float* dlogits, const float* logits, const int32_t* targets, const uint8_t* mask,
                 const float* rmax, const double* sumexp, const double* target_logit, int N,
                 int V, int v_begin, float scale) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int n = 0; n < N; ++n) {
    const float* l = logits + size_t(n) * V;
    float* d = dlogits ? dlogits + size_t(n) * V : nullptr;
    if (!mask[n]) {
      if (d) std::memset(d, 0, sizeof(float) * V);
      continue;
    }
    total += double(rmax[n]) + std::log(sumexp[n]) - target_logit[n];
    if (d) {
      const float s = float(double(scale) / sumexp[n]);
      for (int j = 0; j < V; ++j) d[j] = std::exp(l[j] - rmax[n]) * s;
      const int t = targets[n] - v_begin;
      if (t >= 0 && t < V) d[t] -= scale;
    }
  }
  return total;
}

}  // namespace ft::kernels
