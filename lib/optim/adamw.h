// AdamW over the model's flat parameter groups (torch.optim.AdamW semantics, DESIGN.md §5).
// Weight decay applies only to tensors of two or more dimensions. Each group's moments cover a
// range [begin, end) of the group's flat buffer: the whole buffer without ZeRO, this rank's
// shard with ZeRO stage ≥ 1 (so optimizer state is divided by the data-parallel size).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/adamw_step.h"
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
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;
  // One update of the owned range of every group at learning rate lr; increments the step
  // count first (t ≥ 1). params[g] and grads[g] point at element ranges()[g].begin of group g:
  // into the full buffers, or at the start of this rank's shards. The gradients are read as
  // g · grad_scale (clipping, fp16's unscaling) and left as they are. compute[g], where given
  // and not null, is where the updated range of group g is also written rounded to its dtype
  // (ZeroSharding::compute_bases: the compute copy, refreshed in the same pass). Where the device
  // records graphs (FT_CUDA_GRAPHS=1) the updates are recorded once and replayed (adamw.cpp).
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
  // The step's kernels::AdamwArgs with and without weight decay, where the ops read them (so a
  // recorded graph takes each step's): in device memory, uploaded on the stream of the updates
  // (one stream a run) when they change (args_last_: what args_ holds or is queued to hold).
  // on_host: a pair on update_group's stack instead (the host ops run before it returns).
  Buffer<kernels::AdamwArgs> args_;  // (2), not on_host
  kernels::AdamwArgs args_last_[2] = {};
  bool args_uploaded_ = false;
  Stream args_stream_;
  const kernels::AdamwArgs* device_args(const kernels::AdamwArgs (&args)[2], Stream st);
  // The pair for this step (t_), with and without weight decay.
  void step_args(double lr, float grad_scale, kernels::AdamwArgs (&pair)[2]) const;
  // step() as a graph: the buffers it was recorded with and the device's graph epoch then, the
  // buffers of the last step run op by op (the warm-up), whether a recording failed.
  struct StepGraph {
    void* exec = nullptr;
    std::vector<const void*> buffers, warm;
    uint64_t epoch = 0;
    bool failed = false;
    int recorded = 0;
  };
  StepGraph graph_;
};

}  // namespace ft
