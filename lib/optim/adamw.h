// AdamW over the model's flat parameter groups (torch.optim.AdamW semantics, DESIGN.md §5).
// Weight decay applies only to tensors of two or more dimensions. Each group's moments cover a
// range [begin, end) of the group's flat buffer: the whole buffer without ZeRO, this rank's
// shard with ZeRO stage ≥ 1 (so optimizer state is divided by the data-parallel size).
// Global-norm clipping (clip_grad_norm_ semantics) lives here too.
#pragma once

#include <cstdint>
#include <vector>

#include "model/layout.h"
#include "recipe/recipe.h"
#include "runtime/device.h"

namespace ft {

struct ShardRange {
  size_t begin = 0, end = 0;  // elements of a group's flat buffer
  size_t size() const { return end - begin; }
};

class AdamW {
 public:
  // ranges: one per layout group; empty means every group whole.
  AdamW(const ParamLayout& layout, const OptimizerConfig& cfg, Device* dev,
        std::vector<ShardRange> ranges = {});
  // One update of the owned range of every group at learning rate lr; increments the step
  // count first (t ≥ 1). params and grads are the full flat group buffers.
  void step(std::vector<Buffer<float>>& params, const std::vector<Buffer<float>>& grads, double lr);
  int64_t steps_taken() const { return t_; }
  const std::vector<ShardRange>& ranges() const { return ranges_; }
  size_t state_bytes() const;

 private:
  const ParamLayout& layout_;
  OptimizerConfig cfg_;
  std::vector<ShardRange> ranges_;
  std::vector<Buffer<float>> m_, v_;  // (range size) per group
  int64_t t_ = 0;
};

// Squared L2 norm of every gradient buffer, summed in double.
double grad_sum_squares(const std::vector<Buffer<float>>& grads);
// Scales gradients by max_norm/(norm + 1e-6) when that is below 1; returns the factor applied.
double clip_grads(std::vector<Buffer<float>>& grads, double norm, double max_norm);

}  // namespace ft
