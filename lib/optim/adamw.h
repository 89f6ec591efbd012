// AdamW over the model's flat parameter groups (torch.optim.AdamW semantics, DESIGN.md §5).
// Weight decay applies only to tensors of two or more dimensions. Each group's moments cover a
// range [begin, end) of the group's flat buffer: the whole buffer without ZeRO, this rank's
// shard with ZeRO stage ≥ 1 (so optimizer state is divided by the data-parallel size).
#pragma once

#include <cstdint>
#include <vector>

#include "model/layout.h"
#include "optim/config.h"
#include "parallel/partition.h"
#include "runtime/device.h"

namespace ft {

class AdamW {
 public:
  // ranges: one per layout group; empty means every group whole. A frozen group's range is
  // made empty: it has no moments and is never updated.
  AdamW(const ParamLayout& layout, const OptimizerConfig& cfg, Device* dev,
        std::vector<ShardRange> ranges = {});
  // One update of the owned range of every group at learning rate lr; increments the step
  // count first (t ≥ 1). params[g] and grads[g] point at element ranges()[g].begin of group g:
  // into the full buffers, or at the start of this rank's shards. The gradients are read as
  // g · grad_scale (clipping, fp16's unscaling) and left as they are. compute[g], where given
  // and not null, is where the updated range of group g is also written rounded to its dtype
  // (ZeroSharding::compute_bases: the compute copy, refreshed in the same pass).
  void step(const std::vector<float*>& params, const std::vector<const float*>& grads, double lr,
            float grad_scale = 1.0f, const std::vector<Ref>& compute = {});
  const std::vector<ShardRange>& ranges() const { return ranges_; }
  size_t state_bytes() const;
  // For checkpoints: the moments of group g (ranges()[g].size() floats) and the step count.
  float* exp_avg(int g) { return m_[size_t(g)].data(); }
  float* exp_avg_sq(int g) { return v_[size_t(g)].data(); }
  int64_t step_count() const { return t_; }
  void set_step_count(int64_t t) { t_ = t; }

 private:
  const ParamLayout& layout_;
  OptimizerConfig cfg_;
  Device* dev_;
  std::vector<ShardRange> ranges_;
  std::vector<Buffer<float>> m_, v_;  // (range size) per group
  int64_t t_ = 0;
};

}  // namespace ft
