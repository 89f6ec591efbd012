// SwiGLU activation h = silu(g) * u and its gradient on the CPU.
// Loops over rows run under OpenMP with static schedules, so results are bit-identical from run
// to run for a fixed thread count (resume tests rely on this).
#include <cmath>

#include "kernels/kernels.h"

namespace ft::kernels {

void swiglu_forward(float* h, const float* g, const float* u, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    float s = 1.0f / (1.0f + std::exp(-g[i]));
    h[i] = g[i] * s * u[i];
  }
}

void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    float s = 1.0f / (1.0f + std::exp(-g[i]));
    float silu = g[i] * s;
    du[i] = dh[i] * silu;
    dg[i] = dh[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
}

}  // namespace ft::kernels
