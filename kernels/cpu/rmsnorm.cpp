// RMSNorm forward and backward on the CPU.
// Loops over rows run under OpenMP with static schedules, so results are bit-identical from run
// to run for a fixed thread count (resume tests rely on this).
#include <cmath>

#include "kernels/kernels.h"

namespace ft::kernels {

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N, int C,
                     float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* xr = x + size_t(n) * C;
    float* o = out + size_t(n) * C;
    float ss = 0.f;
    for (int c = 0; c < C; ++c) ss += xr[c] * xr[c];
    float r = 1.0f / std::sqrt(ss / float(C) + eps);
    rstd[n] = r;
    // HF: weight * (x * rstd)
    for (int c = 0; c < C; ++c) o[c] = w[c] * (xr[c] * r);
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int N, int C) {
  // y = w ∘ x r, r = (mean(x²)+eps)^(-1/2)
  // dx = r (w∘dy) − x r³/C Σ_c (w∘dy∘x);  dw += Σ_n dy ∘ x r
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* xr = x + size_t(n) * C;
    const float* dy = dout + size_t(n) * C;
    float* d = dx + size_t(n) * C;
    float r = rstd[n];
    float dot = 0.f;
    for (int c = 0; c < C; ++c) dot += w[c] * dy[c] * xr[c];
    float k = dot * r * r * r / float(C);
    for (int c = 0; c < C; ++c) d[c] = r * w[c] * dy[c] - k * xr[c];
  }
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 64) {
    int c1 = c0 + 64 < C ? c0 + 64 : C;
    for (int n = 0; n < N; ++n) {
      const float* xr = x + size_t(n) * C;
      const float* dy = dout + size_t(n) * C;
      float r = rstd[n];
      for (int c = c0; c < c1; ++c) dw[c] += dy[c] * xr[c] * r;
    }
  }
}

}  // namespace ft::kernels
