// Vectorisable fp32 math for the CPU kernels: an exp for the non-positive arguments of softmax,
// and max / sums over a row in 16 independent lanes. A single running max or sum is a dependency
// chain GCC may not reorder (without -ffast-math), so it runs at one element per add latency;
// lanes let it vectorise. The lanes fix the summation order, so results are the same bits on
// every run. Internal to kernels/cpu/.
#pragma once

#include "kernels/cpu/isa.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS::cpu {

// exp(x) for x ≤ 0 (scores minus a running max or the logsumexp), as Cephes' expf: x = n·ln 2 + r
// with |r| ≤ ln 2 / 2, a degree-6 polynomial for e^r, 2^n put into the exponent bits; within
// 1 ulp of std::exp (checked for every float in [−87, 1]). Written as plain arithmetic so that
// GCC vectorises the loops that call it (std::exp is a scalar libm call per element, and the
// backward takes as many exps as the forward). Inputs below −87.3 give ~1e-38 instead of a
// subnormal or 0: no sum here notices.
inline float exp_nonpositive(float x) {
  // The backward's S − lse may round a little above 0; the upper clamp keeps 2^n in range
  // whatever the input (NaN stays NaN through the polynomial).
  x = std::min(std::max(x, -87.3f), 88.0f);
  // n = round(x / ln 2): adding 1.5·2^23 rounds to an integer in the float unit (std::floor
  // would stop GCC from vectorising the loop).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;  // ln 2 in two parts, so n·ln2 is exact enough
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((int32_t(n) + 127) << 23);
}

// 1 / (1 + exp(−x)) through exp_nonpositive(−|x|), so that it vectorises: e/(1 + e) for x < 0
// is the same quantity without an exp of a positive argument (within 2 ulp of the libm form).
inline float sigmoid(float x) {
  const float e = exp_nonpositive(-std::abs(x));
  const float r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : e * r;
}

// Max of x[0, n), in 16 independent lanes so that it vectorises (a single running max is a
// dependency chain the compiler may not reorder).
inline float lane_max(const float* x, int n, float init) {
  float lane[16];
  for (float& l : lane) l = init;
  int c = 0;
  for (; c + 16 <= n; c += 16)
    for (int i = 0; i < 16; ++i) lane[i] = std::max(lane[i], x[c + i]);
  for (; c < n; ++c) lane[0] = std::max(lane[0], x[c]);
  float m = init;
  for (float l : lane) m = std::max(m, l);
  return m;
}

// x[c] = exp(x[c] − shift) for c < n; returns the sum (16 lanes, as lane_max).
inline float exp_shifted_sum(float* x, int n, float shift) {
  for (int c = 0; c < n; ++c) x[c] = exp_nonpositive(x[c] - shift);
  float lane[16] = {};
  int c = 0;
  for (; c + 16 <= n; c += 16)
    for (int i = 0; i < 16; ++i) lane[i] += x[c + i];
  for (; c < n; ++c) lane[0] += x[c];
  float sum = 0.0f;
  for (float l : lane) sum += l;
  return sum;
}

// Σ x[c]² (fp32) for c < n, 16 lanes (as lane_max).
inline float lane_sum_squares(const float* x, int n) {
  float lane[16] = {};
  int c = 0;
  for (; c + 16 <= n; c += 16)
    for (int i = 0; i < 16; ++i) lane[i] += x[c + i] * x[c + i];
  for (; c < n; ++c) lane[0] += x[c] * x[c];
  float sum = 0.0f;
  for (float l : lane) sum += l;
  return sum;
}

// Σ a[c]·b[c]·d[c] (fp32) for c < n, 16 lanes (as lane_max).
inline float lane_dot3(const float* a, const float* b, const float* d, int n) {
  float lane[16] = {};
  int c = 0;
  for (; c + 16 <= n; c += 16)
    for (int i = 0; i < 16; ++i) lane[i] += a[c + i] * b[c + i] * d[c + i];
  for (; c < n; ++c) lane[0] += a[c] * b[c] * d[c];
  float sum = 0.0f;
  for (float l : lane) sum += l;
  return sum;
}

// Σ x[c]² for c < n in double, 16 lanes (as lane_max).
inline double lane_sum_squares_f64(const float* x, size_t n) {
  double lane[16] = {};
  size_t c = 0;
  for (; c + 16 <= n; c += 16)
    for (int i = 0; i < 16; ++i) lane[i] += double(x[c + i]) * double(x[c + i]);
  for (; c < n; ++c) lane[0] += double(x[c]) * double(x[c]);
  double sum = 0.0;
  for (double l : lane) sum += l;
  return sum;
}

// out[c] = exp(x[c] − shift) (out may be x) and Σ of those in double, 16 lanes. Null out: the
// sum alone.
inline double exp_shifted_sum_f64(float* out, const float* x, size_t n, float shift) {
  double lane[16] = {};
  size_t c = 0;
  if (out) {
    // all 16 loads before the 16 stores, so out == x needs no alias check to vectorise
    for (; c + 16 <= n; c += 16) {
      float e[16];
      for (int i = 0; i < 16; ++i) e[i] = exp_nonpositive(x[c + i] - shift);
      for (int i = 0; i < 16; ++i) {
        out[c + i] = e[i];
        lane[i] += double(e[i]);
      }
    }
    for (; c < n; ++c) lane[0] += double(out[c] = exp_nonpositive(x[c] - shift));
  } else {
    for (; c + 16 <= n; c += 16)
      for (int i = 0; i < 16; ++i) lane[i] += double(exp_nonpositive(x[c + i] - shift));
    for (; c < n; ++c) lane[0] += double(exp_nonpositive(x[c] - shift));
  }
  double sum = 0.0;
  for (double l : lane) sum += l;
  return sum;
}

}  // namespace ft::kernels::FT_CPU_ISA_NS::cpu
FT_CPU_ISA_END
