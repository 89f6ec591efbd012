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
  // on_host (parallel.offload_optimizer): the moments live in the host memory of
  // dev->alloc_host (page-locked on CUDA) and every update runs on dev->host_ops(), the CPU's
  // kernels: params, grads and compute are then host pointers too (ZeroSharding's offload).
  AdamW(const ParamLayout& layout, const OptimizerConfig& cfg, Device* dev,
        std::vector<ShardRange> ranges = {}, bool on_host = false);
  // One update of the owned range of every group at learning rate lr; increments the step
  // count first (t ≥ 1). params[g] and grads[g] point at element ranges()[g].begin of group g:
  // into the full buffers, or at the start of this rank's shards. The gradients are read as
  // g · grad_scale (clipping, fp16's unscaling) and left as they are. compute[g], where given
  // and not null, is where the updated range of group g is also written rounded to its dtype
  // (ZeroSharding::compute_bases: the compute copy, refreshed in the same pass).
  void step(const std::vector<float*>& params, const std::vector<const float*>& grads, double lr,
            float grad_scale = 1.0f, const std::vector<Ref>& compute = {});
  // step() in parts, for a caller that moves each group's result on as soon as it is updated
  // (the offloaded update uploads group g while group g+1 is updated): begin_step increments
  // the step count, then update_group(g, ...) once per group, as step() would with the same
  // arguments. compute may be null. on: the device stream the update is queued on (the
  // overlapped update's; a null handle: the device's stream()).
  void begin_step() { ++t_; }
  void update_group(int g, float* params, const float* grads, double lr, float grad_scale,
                    Ref compute, Stream on = Stream{});
  bool on_host() const { return on_host_; }
  const std::vector<ShardRange>& ranges() const { return ranges_; }
  size_t state_bytes() const;  // on the device (0 on_host)
  // For checkpoints: the moments of group g (ranges()[g].size() floats) and the step count.
  // Host pointers when on_host().
  float* exp_avg(int g) { return on_host_ ? host_m_[size_t(g)].data() : m_[size_t(g)].data(); }
  float* exp_avg_sq(int g) { return on_host_ ? host_v_[size_t(g)].data() : v_[size_t(g)].data(); }
  int64_t step_count() const { return t_; }
  void set_step_count(int64_t t) { t_ = t; }

 private:
  const ParamLayout& layout_;
  OptimizerConfig cfg_;
  Device* dev_;
  std::vector<ShardRange> ranges_;
  bool on_host_;
  Ops& ops_;  // dev->ops(), or dev->host_ops() on_host
  // (range size) per group: device memory, or on_host host memory
  std::vector<Buffer<float>> m_, v_;
  std::vector<HostBuffer<float>> host_m_, host_v_;
  int64_t t_ = 0;
};

}  // namespace ft
