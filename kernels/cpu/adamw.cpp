// AdamW optimizer step on the CPU.
// Loops over rows run under OpenMP with static schedules, so results are bit-identical from run
// to run for a fixed thread count (resume tests rely on this).
#include <cmath>

#include "kernels/kernels.h"

namespace ft::kernels {

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t t) {
  // Mirrors torch.optim.AdamW (single-tensor path): step_size and the bias corrections are
  // computed in double on the host, the element math in float.
  const double bc1 = 1.0 - std::pow(double(beta1), double(t));
  const double bc2 = 1.0 - std::pow(double(beta2), double(t));
  const float step_size = float(double(lr) / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float decay = 1.0f - lr * weight_decay;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    float pi = p[i] * decay;
    float mi = m[i] * beta1 + (1.0f - beta1) * g[i];
    float vi = v[i] * beta2 + (1.0f - beta2) * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = pi - step_size * (mi / denom);
  }
}

}  // namespace ft::kernels
