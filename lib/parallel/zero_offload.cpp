// ZeroSharding's offload (ZeRO-Offload: parallel.offload_optimizer: cpu): the host shards of an
// offloaded run, the gradients landed on the host through staging buffers, the lazy per-group
// update and the upload of its result. The rest of the sharding is in zero.cpp.
#include <algorithm>
#include <utility>

#include "core/error.h"
#include "parallel/host_adder.h"
#include "parallel/zero.h"

namespace ft {

HostShards::HostShards(Device* dev, int data_size, int data_rank, DType compute_dtype)
    : dev_(dev), D_(data_size), rank_(data_rank), cdt_(compute_dtype) {}

void HostShards::take(int group, const ParamGroup& p, const float* values) {
  const size_t g = size_t(group), es = dtype_size(cdt_);
  if (shards_.size() <= g) shards_.resize(g + 1);
  Shard& x = shards_[g];
  const size_t s = zero_shard_size(p.numel, D_);
  const ShardRange r = zero_shard(p.numel, D_, rank_);
  const MemoryScope tag(MemoryCategory::kParameters);
  if (!x.taken) {
    x.compute = HostBuffer<std::byte>(dev_, s * es);
    x.compute.zero();  // the padding past the group's end
    x.master = HostBuffer<float>(dev_, p.trains() ? r.size() : 0);
    x.taken = true;
  }
  if (r.size() == 0) return;
  if (p.trains()) dev_->copy_to_host(x.master.data(), values + r.begin, r.size() * sizeof(float));
  if (cdt_ == DType::kF32) {
    dev_->copy_to_host(x.compute.data(), values + r.begin, r.size() * sizeof(float));
    return;
  }
  // Rounded on the device, as the compute copy is without offload.
  DBuffer low(dev_, cdt_, r.size());
  dev_->ops().convert(dev_->stream(), low.data(), values + r.begin, r.size());
  dev_->copy_to_host(x.compute.data(), low.data().ptr, r.size() * es);
}

void ZeroSharding::land(float* dst, const float* src, size_t n, bool add, Buffer<float> keep) {
  if (n == 0) return;
  if (keep.size()) {
    int kept = 0;
    for (const Landing& x : landings_) kept += x.keep.size() ? 1 : 0;
    while (kept >= kKeptLandings) {
      kept -= landings_.front().keep.size() ? 1 : 0;
      retire_front();
    }
  }
  const Stream cs = dev_->copy_stream();
  Landing l;
  l.dst = dst;
  l.n = n;
  l.keep = std::move(keep);
  float* to = dst;
  if (add) {
    l.staging = take_staging();
    to = l.staging.data();
  }
  // After what the compute stream has queued so far: the work that made src.
  Event ready = dev_->make_event();
  ready.record(dev_->stream());
  dev_->wait(cs, ready);
  dev_->copy_to_host_async(cs, to, src, n * sizeof(float));
  l.done = dev_->make_event();
  l.done.record(cs);
  landings_.push_back(std::move(l));
}

HostBuffer<float> ZeroSharding::take_staging() {
  for (;;) {
    if (!staging_pool_.empty()) {
      HostBuffer<float> b = std::move(staging_pool_.back());
      staging_pool_.pop_back();
      return b;
    }
    if (adder_)
      if (HostBuffer<float> b = adder_->take_back(/*wait=*/false); b.size()) return b;
    if (staging_made_ < 2) {  // two: one landing while the other is added
      ++staging_made_;
      const MemoryScope tag(MemoryCategory::kCommunication);
      return HostBuffer<float>(dev_, max_range_);
    }
    // Both are in landings still in flight, or being added: the oldest staged landing goes to
    // the adder, then one comes back.
    bool staged = false;
    for (const Landing& x : landings_) staged = staged || x.staging.size();
    if (staged) {
      while (!landings_.front().staging.size()) retire_front();
      retire_front();
      if (!staging_pool_.empty()) continue;  // ft plan's counting device adds at once
    }
    FT_CHECK(adder_, "ZeRO offload: no staging buffer in flight, none free");
    if (HostBuffer<float> b = adder_->take_back(/*wait=*/true); b.size()) return b;
  }
}

void ZeroSharding::land_group(int group) {
  const size_t g = size_t(group);
  land(host_grads_[g].data(), flat_.grads()[g].data() + ranges_[g].begin, ranges_[g].size(),
       /*add=*/false);
  landed_[g] = true;
}

void ZeroSharding::retire_front() {
  Landing l = std::move(landings_.front());
  landings_.erase(landings_.begin());
  l.done.synchronize();
  l.keep = Buffer<float>();  // the device buffer the copy read
  if (!l.staging.size()) return;
  if (!dev_->host_memory_backed()) {  // ft plan's counting device: nothing to add, no thread
    dev_->host_ops().add(Stream{}, Ref(l.dst), CRef(l.staging.data()), l.n);
    staging_pool_.push_back(std::move(l.staging));
    return;
  }
  if (!adder_) adder_ = std::make_unique<HostAdder>(dev_->host_ops());
  adder_->add(l.dst, std::move(l.staging), l.n);
}

void ZeroSharding::retire_landings() {
  while (!landings_.empty()) retire_front();
  if (!adder_) return;
  adder_->drain();
  for (HostBuffer<float> b; (b = adder_->take_back(/*wait=*/false)).size();)
    staging_pool_.push_back(std::move(b));
}

void ZeroSharding::offload_update(const GroupUpdate& update) {
  FT_CHECK(offload_, "ZeroSharding::offload_update without offload");
  flush_update();  // a group the last step left pending (none: every one is acquired)
  retire_landings();
  // The point the uploads come after: this step's work on the compute stream, the backward
  // that read the compute copy last. Not the next forward's, which they run under.
  updated_mark_.record(dev_->stream());
  pending_ = update;
  for (size_t g = 0; g < numel_.size(); ++g) stale_[g] = trains_[g] && numel_[g] > 0;
  if (!update) flush_update();  // sync_compute_params: every group now
}

void ZeroSharding::ensure_updated(int group) {
  const size_t g = size_t(group);
  if (group < 0 || g >= stale_.size() || !stale_[g]) return;
  stale_[g] = false;
  const bool fp32 = cdt_ == DType::kF32;
  const size_t own = ranges_[g].size();
  float* master = host_master_[g].data();
  if (offload_params_) {
    // The compute copy's shard is host memory itself: written in the update's pass, nothing to
    // upload (the group's gathers copy it).
    const Ref compute(host_compute_[g].data(), cdt_);
    if (pending_)
      pending_(group, master, host_grads_[g].data(), compute);
    else
      dev_->host_ops().convert(Stream{}, compute, CRef(master), own);
    return;
  }
  Ref compute;
  if (!fp32) {
    up_done_[slot_].synchronize();  // its last upload has left the staging buffer
    compute = Ref(up_staging_[slot_].data(), cdt_);
  }
  if (pending_)
    pending_(group, master, host_grads_[g].data(), compute);
  else if (!fp32)
    dev_->host_ops().convert(Stream{}, compute, CRef(master), own);
  const Stream used = upload_range(group, fp32 ? static_cast<const void*>(master) : compute.ptr);
  if (!fp32) {
    up_done_[slot_].record(used);
    slot_ ^= 1;
  }
}

Stream ZeroSharding::upload_range(int group, const void* src) {
  const size_t g = size_t(group);
  const Stream st = dev_->stream();
  const size_t own = ranges_[g].size(), bytes = own * dtype_size(cdt_);
  void* dst = nullptr;
  if (stage_ == 3)
    dst = compute_shards_[g].data().ptr;
  else if (stage_ == 0 || D_ == 1)
    dst = (flat_.compute_params(group) + ranges_[g].begin).ptr;
  if (dst) {
    // On the copy stream after the step's work (updated_mark_), so that it runs under the
    // forward of the groups before; the group's use waits for up_event_ (acquire_params,
    // start_gather).
    const Stream cs = dev_->copy_stream();
    dev_->wait(cs, updated_mark_);
    dev_->copy_from_host_async(cs, dst, src, bytes);
    up_event_[g].record(cs);
    return cs;
  }
  // Stages 1-2 of several ranks: the all-gather that follows is ordered on the compute stream,
  // and so is the copy.
  const size_t s = shard_[g];
  const Ref mine = scratch_.data() + size_t(rank_) * s;
  dev_->copy_from_host_async(st, mine.ptr, src, bytes);
  comm_.all_gather(st, mine, scratch_.data(), s).wait_on(st);
  dev_->copy(st, flat_.compute_params(group).ptr, scratch_.data().ptr,
             numel_[g] * dtype_size(cdt_));
  return st;
}

}  // namespace ft
