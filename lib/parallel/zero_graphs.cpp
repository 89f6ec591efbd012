// ZeroSharding's part in graphs (GroupHooks::Replay, FT_CUDA_GRAPHS=1; DESIGN.md §2 "Graphs"):
// which kind of micro-batch it is, the recording's state and its undoing, the agreement between
// ranks, and the host's part of each launch. The rest of the sharding is in zero.cpp.
#include <algorithm>
#include <utility>

#include "comm/device_comm.h"
#include "core/error.h"
#include "parallel/zero.h"

namespace ft {

GroupHooks::Replay ZeroSharding::micro_batch_replay(NoReplay* why) const {
  const auto none = [&](const char* reason, bool lasting) {  // (no string made without `why`)
    if (why) *why = {reason, lasting};
    return Replay::kNone;
  };
  // Stages 2-3: every micro-batch reduce-scatters each group's working gradient (stage 3 also
  // all-gathers the parameters), in kept buffers, so every one is of the kind that records
  // its collectives.
  // Stage 3 with prefetch: not before a step has recorded the order, so that the op-by-op
  // warm-up prefetches as the recording will (and makes the buffers it will use).
  if (keeps_working())
    return stage_ == 3 && opt_.prefetch_blocks > 0 && !order_recorded_
               ? none("ZeRO stage 3 records from its second step", false)
               : Replay::kCollectives;
  if (offload_)
    return none("parallel.offload_optimizer's copies to and from the host are not recorded", true);
  // The overlapped update runs under the forward of the micro-batch after it, whose waits for it
  // (wait_update: on events the update stream records outside any graph) keep it op by op;
  // micro-batches with no update pending may record.
  if (std::find(update_pending_.begin(), update_pending_.end(), true) != update_pending_.end())
    return none(
        "with parallel.overlap_update the micro-batch after each update (a step's first) runs op "
        "by op, the update under its forward",
        true);
  if (stage_ >= 2 && !opt_.graphs)
    return none("the model records no graphs (ZeroOptions::graphs)", true);
  if (stage_ >= 2)  // (not keeps_working: over MPI)
    return none(
        stage_ == 2
            ? "ZeRO stage 2's reduce-scatters over MPI are not recorded (over NCCL they are)"
            : "ZeRO stage 3's reduce-scatters over MPI are not recorded (over NCCL they are)",
        true);
  if (D_ > 1 && opt_.overlap)
    for (size_t g = 0; g < ready_count_.size(); ++g)
      if (trains_[g] && numel_[g] && ready_count_[g] + 1 >= micro_batches_)
        return (opt_.reduce_dtype == DType::kF32 || keeps_low_grads()) && comm_.records_in_graphs()
                   ? Replay::kCollectives
                   : none(
                         "a step's last micro-batch, whose all-reduces overlap_comm issues, "
                         "runs op by op: over MPI they are not recorded (over NCCL they are)",
                         true);
  return Replay::kHostOnly;
}

bool ZeroSharding::keeps_low_grads() const {
  return opt_.graphs && opt_.reduce_dtype != DType::kF32 && opt_.overlap && D_ > 1 && stage_ < 2 &&
         !offload_;
}

bool ZeroSharding::keeps_working() const {
  return opt_.graphs && stage_ >= 2 && !offload_ && !opt_.overlap_update &&
         (D_ == 1 || comm_.records_in_graphs());
}

void ZeroSharding::inject_nan_before_graph() {
  // Into the gradient the micro-batch adds to (at stage 2 the shard), before it: the NaN stays,
  // as if written just before the reductions (the graph cannot copy from the host while it
  // records or runs).
  for (size_t g = 0; g < numel_.size() && nan_pending_; ++g)
    if (trains_[g])
      maybe_inject_nan(int(g), stage_ >= 2 ? grad_shards_[g].data() : flat_.grads()[g].data(),
                       /*shard=*/stage_ >= 2);
}

void ZeroSharding::begin_recording() {
  inject_nan_before_graph();
  if (stage_ >= 2) {
    start_whole_micro_batch();
  }
  recording_ = {ready_count_, reduced_, reducing_.size()};
}

void ZeroSharding::start_whole_micro_batch() {
  // An op-by-op micro-batch's reduce-scatters still in flight retire, and its unused
  // prefetches are dropped, so that the micro-batch starts with every kept buffer free, as the
  // recording did; the prefetch order from its start.
  retire_scatters(0);
  drop_prefetches();
  pos_ = 0;
  order_ok_ = true;
}

bool ZeroSharding::peers_record() const { return D_ > 1 && comm_.records_in_graphs(); }

void ZeroSharding::join_recorded() {
  if (stage_ >= 2) {
    // Stages 2-3: the recorded reduce-scatters retired inside the graph (each shard summed, every
    // buffer free) and the gathers not used dropped, so that the graph is the whole micro-batch
    // and the next starts as it did.
    retire_scatters(0);
    drop_prefetches();
    // The recorded gathers' handles, every one waited on inside the graph: the host may not
    // wait on a recorded call, so none is kept.
    for (CommWork& w : gathering_) w = CommWork();
    for (size_t g = 0; g < working_grads_.size(); ++g) {
      FT_CHECK(!working_grads_[g], "ZeRO stage ", stage_, ": group ", g,
               "'s working gradient was taken in the recorded micro-batch but never reported "
               "complete (grads_ready)");
      FT_CHECK(stage_ < 3 || (refs_[g] == 0 && !gathered_[g]), "ZeRO stage 3: group ", g,
               "'s parameters are still held at the end of the recorded micro-batch");
    }
    return;
  }
  // The compute stream after the recorded all-reduces, inside the graph, each widened back from
  // its kept 16-bit buffer where it went through one: finish_backward finds them done.
  graph_reduces_.assign(reduced_.size(), false);
  for (size_t g = 0; g < reduced_.size(); ++g)
    graph_reduces_[g] = reduced_[g] && !recording_.reduced[g];
  const Stream st = dev_->stream();
  for (size_t i = recording_.reducing; i < reducing_.size(); ++i) {
    Reduction& r = reducing_[i];
    FT_CHECK((!r.low || r.low.kept()) && !r.landed.valid(),
             "a recorded reduction with a buffer made for the call or an offload copy");
    r.work.wait_on(st);
    if (r.low) dev_->ops().convert(st, r.dst, r.low.data(), r.n);
  }
  reducing_.resize(recording_.reducing);  // (their kept buffers given back, used in stream order)
}

void ZeroSharding::recording_failed() {
  // The recorded calls' handles are dropped unwaited: nothing ran; their buffers are given back.
  // (Stages 2-3: every kept buffer was free when the recording began.)
  reducing_.resize(recording_.reducing);
  if (stage_ >= 2) {
    scatters_.clear();
    for (auto& w : working_grads_) w.reset();
    if (stage_ == 3) {  // (the recording may have stopped between an acquire and its release)
      for (auto& p : gathered_) p.reset();
      for (CommWork& w : gathering_) w = CommWork();
      std::fill(refs_.begin(), refs_.end(), 0);
      pos_ = 0;
    }
  }
  ready_count_ = recording_.ready_count;
  reduced_ = recording_.reduced;
}

void ZeroSharding::graphs_off() {
  if (!opt_.graphs) return;
  opt_.graphs = false;
  // Nothing in flight uses them: recording_failed gave back what the recording took, and the
  // recording began with every scatter retired (stage 0-1: no reduction of the step is issued
  // before its last micro-batch, the one recorded).
  FT_CHECK(scatters_.empty() && reducing_.empty() && !kept_f32_.in_use() && !kept_low_.in_use() &&
               !kept_params_.in_use(),
           "ZeRO: a buffer kept for graphs is still in use after the recording failed");
  kept_f32_.clear();
  kept_low_.clear();
  kept_params_.clear();
}

bool ZeroSharding::agree_recorded(bool ok) { return agree_.all_ok(ok); }

void ZeroSharding::launch_collectives(const std::function<void()>& launch,
                                      const std::vector<int>& groups, bool recorded_now) {
  if (stage_ >= 2) {
    // Stages 2-3: the graph reduce-scatters and sums every group it reports, whichever
    // micro-batch of the step it is; the host's part is the counts. It starts with every kept
    // buffer free.
    start_whole_micro_batch();
    std::vector<int> count = ready_count_;
    if (!recorded_now)
      for (const int group : groups)
        if (trains_[size_t(group)]) count_ready(count, group);
    inject_nan_before_graph();
    comm_.watched_launch(dev_->stream(), "micro_batch_graph", launch);
    ready_count_ = std::move(count);
    return;
  }
  // The host's part, checked before the launch: the graph reduces what its recording reduced,
  // so the same groups must be final now (else the graph would reduce a partial gradient).
  std::vector<int> count = ready_count_;
  std::vector<bool> reduced = reduced_;
  if (!recorded_now)
    for (const int group : groups) {
      const size_t g = size_t(group);
      if (!trains_[g]) continue;
      const bool last = count_ready(count, group);
      const bool reduces = last && D_ > 1 && opt_.overlap && numel_[g];
      FT_CHECK(reduces == bool(graph_reduces_[g]) && !reduced[g], "ZeRO: group ", group,
               "'s reduction in the micro-batch graph does not match the step (", count[g], " of ",
               micro_batches_, " micro-batches)");
      if (reduces) reduced[g] = true;
    }
  inject_nan_before_graph();
  comm_.watched_launch(dev_->stream(), "micro_batch_graph", launch);
  ready_count_ = std::move(count);
  reduced_ = std::move(reduced);
}

}  // namespace ft
