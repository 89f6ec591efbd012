// AdamW's per-step constants, computed on the host for both backends (kernels/cpu/adamw.cpp,
// kernels/cuda/adamw.cu), so the CPU and the GPU start every element update from the same bits.
// Mirrors torch.optim.AdamW (single-tensor path): step size and bias corrections in double, the
// element math in float.
#pragma once

#include <cmath>
#include <cstdint>

namespace ft::kernels {

struct AdamwStep {
  float beta1, beta2, eps;
  float step_size, bc2_sqrt, decay;
};

// What an update reads from memory when it runs (the Ops op and the GPU kernel; so a recorded
// CUDA graph takes each step's): the step's constants and the factor on the gradients.
struct AdamwArgs {
  AdamwStep step;
  float grad_scale;
};

// t: the step count after increment (1 for the first update).
inline AdamwStep adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay,
                            int64_t t) {
  const double bc1 = 1.0 - std::pow(double(beta1), double(t));
  const double bc2 = 1.0 - std::pow(double(beta2), double(t));
  return {
      beta1, beta2, eps, float(double(lr) / bc1), float(std::sqrt(bc2)), 1.0f - lr * weight_decay};
}

}  // namespace ft::kernels
