// AdamW over the model's flat parameter groups (torch.optim.AdamW semantics, DESIGN.md §5).
// Moments mirror the parameter layout; weight decay applies only to tensors of two or more
// dimensions. Global-norm clipping (clip_grad_norm_ semantics) lives here too.
#pragma once

#include <cstdint>
#include <vector>

#include "model/layout.h"
#include "recipe/recipe.h"
#include "runtime/device.h"

namespace ft {

class AdamW {
 public:
  AdamW(const ParamLayout& layout, const OptimizerConfig& cfg, Device* dev);
  // One update of every group at learning rate lr; increments the step count first (t ≥ 1).
  void step(std::vector<Buffer<float>>& params, const std::vector<Buffer<float>>& grads, double lr);
  int64_t steps_taken() const { return t_; }
  std::vector<Buffer<float>>& exp_avg() { return m_; }
  std::vector<Buffer<float>>& exp_avg_sq() { return v_; }
  size_t state_bytes() const;

 private:
  const ParamLayout& layout_;
  OptimizerConfig cfg_;
  std::vector<Buffer<float>> m_, v_;
  int64_t t_ = 0;
};

// Squared L2 norm of every gradient buffer, summed in double.
double grad_sum_squares(const std::vector<Buffer<float>>& grads);
// Scales gradients by max_norm/(norm + 1e-6) when that is below 1; returns the factor applied.
double clip_grads(std::vector<Buffer<float>>& grads, double norm, double max_norm);

}  // namespace ft
