// ZeRO over the data-parallel group (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
// Training Trillion Parameter Models", 2020), on the model's flat group buffers. Each group of
// n elements is cut into D contiguous shards of s = ceil(n / D) (the last padded); data rank r
// owns [r·s, min(n, (r+1)·s)) (zero_shard, lib/parallel/partition.h).
//   stage 0: full gradients all-reduced; every rank updates everything.
//   stage 1: optimizer moments for the owned shard only; update the shard, all-gather params.
//   stage 2: also gradients: each group's micro-batch gradient is reduce-scattered as soon as its
//            backward is done (working buffer freed), accumulating into the owned shard.
//   stage 3: also parameters: only the shard is resident; a group's parameters are all-gathered
//            just before it runs and freed after.
// A frozen group (ParamGroup::trains) takes part only as parameters: no gradient (shard or
// working buffer), no reduction, no place in the gradient norm, no fp32 master: its compute copy
// (stage 3: the compute copy of its shard) is all it holds, and it never changes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/device_comm.h"
#include "parallel/flat_params.h"
#include "parallel/kept.h"
#include "parallel/partition.h"
#include "runtime/device.h"

namespace ft {

class HostAdder;  // host_adder.h

// How the data group's gradient reductions meet the backward (DESIGN.md §3, "Overlap").
//   overlap: each group's gradient is reduced as soon as it is final (stages 0-1: after the
//     last micro-batch's backward of the group; stages 2-3: each micro-batch's, as before),
//     its call left in flight on the communicator's stream while the backward goes on, and
//     waited for by finish_backward; off: stages 0-1 reduce every group after the whole
//     backward, stages 2-3 wait for each reduce-scatter at once. The calls (their buffers and
//     sizes) are the same either way, so the bits are too.
//   bucket_elems: a reduction's largest call; a larger group is reduced in several calls.
//   prefetch_blocks: ZeRO-3 gathers this many groups ahead of the one the model acquires, in
//     the order the first step acquired them (FSDP's prefetch); 0: each when it is acquired.
//   reduce_dtype: the element type the gradient reductions move and sum in (FSDP's
//     reduce_dtype): fp32, or bf16 (half the bytes; each rank's fp32 gradient rounded to bf16
//     before, the sum widened back after). Needs a communicator that sums bf16 (NCCL).
//   offload_optimizer (parallel.offload_optimizer: cpu; ZeRO-Offload, Ren et al. 2021): this
//     rank's fp32 masters of its ranges, their gradients and (AdamW on_host) the moments live in
//     host memory (alloc_host: page-locked on CUDA); see "Offload" below.
class HostShards;
struct ZeroOptions {
  bool overlap = true;
  // parallel.overlap_update (stage 0, no offload): the update on the device's update stream,
  // under the next forward ("Overlapped update" below).
  bool overlap_update = false;
  bool offload_optimizer = false;
  // parallel.offload_params (stage 3, with offload_optimizer): this rank's shards of the compute
  // copy in host memory too, written there as the weights were (host_shards, below, the model's
  // FlatParams sink); each group's all-gather starts with a copy from them.
  HostShards* host_shards = nullptr;
  DType reduce_dtype = DType::kF32;
  int prefetch_blocks = 1;
  size_t bucket_elems = size_t(25) << 20 >> 2;  // 25 MiB of fp32, as PyTorch DDP's bucket_cap_mb
  // The model may record its micro-batches as graphs (LlamaModel::may_record_graphs, and no row
  // objective): the buffers a recorded micro-batch uses are kept for the run where the hooks
  // take part in it (keeps_low_grads, keeps_working); elsewhere they are made per call.
  bool graphs = false;
};

// parallel.offload_params: this data rank's ZeRO-3 shard of each group in host memory (page-locked,
// alloc_host), filled as the model's weights are written, group by group (the FlatParams' sink),
// so that start-up never holds more than one group on the device. Per group: the compute copy's
// shard (s elements of the compute dtype, zero past the group's end) and, for a group that
// trains, the fp32 master of its range. ZeroSharding takes the buffers over (host_shards).
class HostShards final : public GroupSink {
 public:
  HostShards(Device* dev, int data_size, int data_rank, DType compute_dtype);
  void take(int g, const ParamGroup& group, const float* values) override;
  struct Shard {
    bool taken = false;
    HostBuffer<std::byte> compute;
    HostBuffer<float> master;
  };
  // Indexed by group; a group never taken (not held, or not streamed) has taken false.
  std::vector<Shard>& shards() { return shards_; }

 private:
  Device* dev_;
  int D_, rank_;
  DType cdt_;
  std::vector<Shard> shards_;
};

// Offload (DESIGN.md §3 "Offload"). The device keeps the compute copy (stage 3: its shard) and
// what the backward writes; the host keeps the fp32 state of this rank's ranges: masters,
// gradients, moments. A step then goes:
//   backward: each group's gradient leaves the device as soon as it is final on this rank,
//     copied on the device's copy stream while the backward goes on: stages 0-1 the group's
//     range once reduced (with one data rank, at its last micro-batch's grads_ready; with more,
//     bucket by bucket, each after its all-reduce); stages 2-3 each micro-batch's reduce-scattered
//     shard, the first straight into the host gradient, the later ones into one of two staging
//     buffers, added into it on a host thread of its own once landed (the device holds no
//     gradient shard at all, and at most two micro-batch gradients waiting for their copies);
//   grad_sum_squares: stages 2-3 sum the host gradients on the host (stages 0-1 on the device,
//     whose full gradients are there);
//   update (offload_update, instead of AdamW::step + finish_update): registered, then applied
//     group by group as the next forward (or an evaluation) first uses each group: AdamW on the
//     host, the result rounded to the compute dtype in the same pass and copied to the device on
//     the copy stream (from one of two staging buffers; stages 1-2 then all-gather it on the
//     compute stream), and the next group's too, so that its update and copy run while this one
//     computes. The host works while the device runs the forward of the groups before; a
//     checkpoint's save (flush_update) applies what is left first.
// The arithmetic of the update is the CPU kernel's (kernels/cpu/adamw.cpp), the same formula as
// the GPU's; no step is delayed: every group is updated before the next step uses it.
//
// Overlapped update (parallel.overlap_update, stage 0 without offload): AdamW runs on the device's
// update stream, group by group in layout order (the forward's), each group's gradient zeroed
// there after its update, once the step's work on the compute stream is done; the compute stream
// waits for a group's update only where the next step first uses the group (acquire_params,
// grads), or for all of them before anything else reads the state (flush_update: a checkpoint's
// save, the end of the run). The memory-bound update of later groups thus runs under the
// compute-bound forward of the earlier ones. The same kernels on the same values: the same bits.
class ZeroSharding final : public GroupHooks {
 public:
  // tensor_comm, pipeline_comm (may be null): the other groups that hold parts of the model,
  // for the gradient norm over every part.
  ZeroSharding(int stage, FlatParams& flat, Communicator& data_comm, Device* dev,
               Communicator* tensor_comm = nullptr, Communicator* pipeline_comm = nullptr,
               ZeroOptions options = {});
  // A group held by two pipeline stages (tied embeddings on the first and last): its gradient is
  // summed between them, and it counts half on each in the norm.
  void share_group(int group, Communicator* holders);
  void reduce_shared_groups();  // after finish_backward
  ~ZeroSharding() override;

  const std::vector<ShardRange>& ranges() const { return ranges_; }
  // Zeroes the gradients of the step, whose backward runs `micro_batches` micro-batches on
  // this rank (each group's last one makes its gradient final).
  void begin_step(int micro_batches);
  // Every reduction of the step issued and ordered on the compute stream (stage 0/1: the
  // all-reduce of the groups not reduced during the backward).
  void finish_backward();
  double grad_sum_squares();  // over the whole model: every data and tensor shard
  // After finish_backward: the first tensor in layout order (groups, then their entries) whose
  // gradient, in the part this rank holds (its shard at stage >= 2), has a NaN or inf element.
  // Returned as the tensor's index counting every entry of the layout's groups from 0, so that
  // ranks agree on the first one with a min over the world; -1 when every element is finite.
  int64_t first_nonfinite_grad() const;
  // Test support (FT_TEST_NAN_GRAD_AT_STEP in step.cpp): called before the step's backward;
  // just before that group's gradient is reduced, writes NaN into the first gradient element
  // this rank holds (first non-empty group and shard), where a real NaN from backward would
  // be, so the reductions carry it as they would carry that one.
  void inject_nan_grad_for_test();
  // At ranges()[g].begin, for AdamW; null for a frozen group.
  std::vector<float*> param_bases();
  std::vector<const float*> grad_bases();
  // Where AdamW writes the compute copy of what it updates, aligned with param_bases(): with a
  // 16-bit compute dtype at stage 0 (or one data rank) and stage 3; null elsewhere (fp32: the
  // parameters are the masters; stages 1/2: the rounded shards go through one all-gather
  // buffer shared by the groups, filled group by group in finish_update).
  std::vector<Ref> compute_bases();
  // After AdamW updated the fp32 masters, through compute_bases(): refresh the rest of the
  // compute copy (stages 1/2 round and all-gather the updated shards).
  void finish_update();
  // Whether param_bases() and grad_bases() are host memory (offload; AdamW is then on_host).
  bool offloaded() const { return offload_; }
  bool params_offloaded() const { return offload_params_; }
  // Offload's phase 6, instead of AdamW::step and finish_update (after AdamW::begin_step): for
  // each trained group, update(g, master, grad, compute): AdamW::update_group on these host
  // pointers (param_bases()[g], grad_bases()[g]), writing the updated range rounded to the
  // compute dtype into `compute` (host memory; null in fp32, where the master itself goes up);
  // then that range goes to the device. Applied lazily, each group when it is next acquired
  // (see "update" above): `update` is kept until then, so it must hold what it needs by value.
  // Null: every group's compute copy from its master, now (sync_compute_params).
  using GroupUpdate = std::function<void(int g, float* master, const float* grad, Ref compute)>;
  void offload_update(const GroupUpdate& update);
  // Overlapped update, instead of AdamW::step and finish_update (after AdamW::begin_step):
  // update(g, s) queues group g's AdamW on stream s (AdamW::update_group with that stream).
  bool overlaps_update() const { return opt_.overlap_update; }
  void overlapped_update(const std::function<void(int g, Stream s)>& update);
  // Applies what offload_update left pending to every group now (the overlapped update: orders
  // all of it before the compute stream's next work): before anything reads the state or the
  // compute copy other than through acquire_params (a checkpoint's save, the end of a run).
  // No-op with nothing pending.
  void flush_update();
  // Makes the compute copy of the parameters equal the fp32 masters (after a resume has loaded
  // them): what finish_update does.
  void sync_compute_params();

  // Resident device bytes on this rank (for the metrics): parameters, gradients (offloaded
  // state is host memory, not counted here).
  size_t params_bytes() const;
  size_t grads_bytes() const;

  // GroupHooks (stages 2 and 3; stages 0-1 with more than one data rank, offload or the
  // overlapped update)
  CRef acquire_params(int group) override;
  void release_params(int group) override;
  float* grads(int group) override;
  void grads_ready(int group) override;
  // Graphs (GroupHooks::Replay), at stages 0-1 without offload (with the overlapped update, the
  // micro-batches with no update pending):
  // kHostOnly where no group's gradient is made final by the micro-batch while overlap_comm
  // reduces it there (grads_ready): the micro-batches of a step but its last, or every one
  // without overlap_comm (the test NaN goes in with the reductions, never during these);
  // kCollectives for the one that reduces, where the data group's communicator records its
  // all-reduces (NCCL; with reduce_dtype bf16 through each group's kept conversion buffer, and
  // widened back inside the graph); a test NaN pending then goes into the gradient before the
  // micro-batch, not while it reduces. At stages 2-3 (keeps_working: NCCL or one data rank)
  // every micro-batch is kCollectives, the whole micro-batch in its graph (its gathers, its
  // reduce-scatters and their sums into the shards), the NaN into the shard before it; stage 3
  // not before a step has recorded its prefetch order.
  Replay micro_batch_replay(NoReplay* why = nullptr) const override;
  void begin_recording() override;
  void join_recorded() override;
  void recording_failed() override;
  bool peers_record() const override;
  bool agree_recorded(bool ok) override;
  void launch_collectives(const std::function<void()>& launch, const std::vector<int>& groups,
                          bool recorded_now) override;
  // The model records no more graphs (a recording failed): the buffers kept for them are freed
  // and made per call again (after recording_failed, when none is in use).
  void graphs_off() override;

 private:
  size_t shard(int g) const { return shard_[size_t(g)]; }
  // sync_compute_params, or after AdamW (which wrote compute_bases()): the rest of it.
  void refresh_compute_params(bool after_adamw);
  // Stage 0/1: the all-reduce of group g's full gradient, in calls of at most bucket_elems.
  void reduce_group(int g);
  // Stage >= 2: a reduce-scatter in flight and its buffers; retired (its shard added to the
  // group's gradient shard, the buffers freed) once ordered on the compute stream.
  struct Scatter {
    int group;
    CommWork work;
    Held<Buffer<float>> working, mine;  // working: what the call reads (fp32)
    Held<DBuffer> low_in, low_out;      // reduce_dtype bf16: what the call reads and writes
  };
  // Stages 2-3 with graphs (keeps_working(): FT_CUDA_GRAPHS=1, no offload or overlap_update):
  // the working gradients, the reduce-scatters' buffers and (stage 3) the gathered parameters
  // are buffers kept for the run (Kept, kept.h), and so are stages 0-1's bf16 conversions
  // (keeps_low_grads). Each is taken where op by op it would be made and given back where it
  // would be freed: hold_* hands out either kind (Held). The scatters retire by count only (a
  // recording cannot ask whether a call is done), and a recorded micro-batch ends with all of
  // them retired and every gather used or dropped, every buffer free again.
  bool keeps_working() const;
  Held<Buffer<float>> hold_f32(size_t n);  // working gradients, the scatters' outputs
  Held<DBuffer> hold_low(size_t n);        // reduce_dtype bf16: the conversions
  Held<DBuffer> hold_params(size_t n);     // stage 3: gathered parameters
  float* working(size_t g) { return working_grads_[g].data(); }  // stage >= 2
  Ref gathered(size_t g) { return gathered_[g].data(); }         // stage 3, null when none
  void start_whole_micro_batch();  // before a recorded micro-batch, and before each launch
  // Stage 0/1: an all-reduce call in flight; with reduce_dtype bf16 it sums the n elements in
  // `low` (hold_low), widened back into dst once the call is ordered on the compute stream.
  struct Reduction {
    CommWork work;
    Held<DBuffer> low;
    size_t n = 0;
    float* dst = nullptr;
    Event landed;  // offload: recorded on the copy stream after the bucket went to the host
  };
  // Whether reduce_group's conversions are kept buffers rather than made per call: with graphs
  // (FT_CUDA_GRAPHS=1), a 16-bit reduce_dtype and overlap_comm, where a step's last micro-batch
  // records its all-reduces (a recording makes no allocation, and a graph keeps the addresses
  // it was recorded with).
  bool keeps_low_grads() const;
  // The step's count of grads_ready calls for group g, one more; true when that makes its
  // gradient final. More calls than micro-batches is an internal error.
  bool count_ready(std::vector<int>& count, int group) const;
  void retire_scatters(size_t keep);  // all but the newest `keep`
  void wait_update(int group);        // the compute stream after group's overlapped update
  void start_gather(size_t g);        // stage 3
  void prefetch_after(int group);
  bool shared(int g) const;  // held by two pipeline stages (share_group)
  void drop_prefetches();
  // Test support (inject_nan_grad_for_test): a NaN into the first trained group's range of
  // `grad`, a full-size gradient, or its shard where `shard`.
  void maybe_inject_nan(int g, float* grad, bool shard = false);
  void inject_nan_before_graph();  // the same, before a kCollectives micro-batch
  int stage_;
  FlatParams& flat_;  // the model's parameters
  Communicator& comm_;
  Device* dev_;
  DType cdt_;  // the model's compute dtype
  Communicator* tensor_comm_;
  Communicator* pipeline_comm_;
  std::vector<std::pair<int, Communicator*>> shared_;  // groups held by two stages
  // *acc += Σ x² over [begin, end) of group g's buffer `x` (which starts at element `base`),
  // with tensor-replicated tensors weighted 1/T so the tensor all-reduce counts them once (and
  // groups held by two pipeline stages 1/2).
  void weighted_sum_squares(Ops& ops, Stream st, double* acc, int g, const float* x, size_t base,
                            size_t begin, size_t end) const;
  // Offload: copies `n` floats of device memory `src` to the host on the copy stream, after the
  // work queued on the compute stream so far: into dst, or (add) into a staging buffer that
  // retire_landings adds into dst once it has landed. keep: the device buffer src lies in, held
  // until then (null: src outlives the step).
  // At most kKeptLandings landings hold a device buffer at once: before another is queued, the
  // oldest are waited for. A fixed count, not "until the copy is seen done", so that the
  // device's peak does not depend on how far the host runs ahead of the GPU (ft plan counts
  // the same). The staged adds run on a host thread of their own (HostAdder, host_adder.h), so
  // that the thread that queues the backward never stops to add.
  void land(float* dst, const float* src, size_t n, bool add, Buffer<float> keep = {});
  void land_group(int g);  // stages 0-1: group g's range of the full gradient
  // Waits for the oldest landing's copy, frees its device buffer, hands its add (if staged) to
  // the adder.
  void retire_front();
  // Every landing retired and every add done: the host gradients are whole.
  void retire_landings();
  HostBuffer<float> take_staging();  // a free staging buffer (at most two exist)
  // Offload: group g's range (stage 3: its shard) of the compute copy from host memory `src`
  // (compute dtype): on the copy stream, or the compute stream where stages 1-2 all-gather it
  // after; returns the stream used.
  Stream upload_range(int g, const void* src);
  // Offload: applies the pending update to group g now, if it has not been (and uploads it).
  void ensure_updated(int g);

  ZeroOptions opt_;
  int D_, rank_;
  // The buffers kept for graphs (keeps_working, keeps_low_grads), before every Held that may
  // point into them (so destroyed after).
  Kept<Buffer<float>> kept_f32_;  // working gradients, the scatters' outputs
  Kept<DBuffer> kept_low_;        // reduce_dtype bf16: the conversions
  Kept<DBuffer> kept_params_;     // stage 3: gathered parameters
  int micro_batches_ = 1;
  std::vector<int> ready_count_;     // grads_ready calls of each group this step
  std::vector<Reduction> reducing_;  // stage 0/1: each group's all-reduce calls in flight
  std::vector<bool> reduced_;        // stage 0/1: group issued this step
  // begin_recording's state, for recording_failed; the groups the recording reduced, which each
  // launch of its graph reduces.
  struct Recording {
    std::vector<int> ready_count;
    std::vector<bool> reduced;
    size_t reducing = 0;
  } recording_;
  std::vector<bool> graph_reduces_;
  std::vector<Scatter> scatters_;   // stage >= 2, oldest first
  bool nan_pending_ = false;        // test support
  bool warned_unreported_ = false;  // finish_backward's warning, once a run
  std::vector<size_t> numel_, shard_;
  std::vector<bool> trains_;  // per group: ParamGroup::trains
  std::vector<ShardRange> ranges_;
  // fp32 master weights: stage 3 (s) per group; 16-bit compute dtype at stages 0-2: the range.
  std::vector<Buffer<float>> master_;
  std::vector<DBuffer> compute_shards_;     // stage 3, 16-bit: (s) per group, the compute copy
  std::vector<Buffer<float>> grad_shards_;  // stage ≥ 2: (s) per group
  std::vector<Held<DBuffer>> gathered_;     // stage 3: full params of groups in use (D·s)
  std::vector<CommWork> gathering_;         // stage 3: their all-gathers, until acquired
  // Stage 3 prefetch: the first step's order of acquisitions, where this step is in it.
  std::vector<int> order_;
  bool order_recorded_ = false, order_ok_ = false, in_step_ = false;
  bool order_per_micro_batch_ = false;  // the order is one micro-batch's (keeps_working)
  size_t pos_ = 0;
  std::vector<int> refs_;                           // stage 3: acquire count per group
  std::vector<Held<Buffer<float>>> working_grads_;  // stage ≥ 2: (D·s) per group in backward
  DBuffer scratch_;                                 // stage 1/2: all-gather buffer (D·max s)
  // Offload (see above). host_master_/host_grads_: (range size) per trained group, host memory.
  bool offload_ = false;
  std::vector<HostBuffer<float>> host_master_, host_grads_;
  std::vector<bool> landed_;  // stage ≥ 2: the group's first micro-batch has gone to the host
  struct Landing {
    Event done;  // recorded on the copy stream after the copy
    Buffer<float> keep;
    HostBuffer<float> staging;  // add: what landed, to add into dst
    float* dst = nullptr;
    size_t n = 0;
  };
  static constexpr int kKeptLandings = 2;
  std::vector<Landing> landings_;  // oldest first
  std::vector<HostBuffer<float>> staging_pool_;
  int staging_made_ = 0;
  std::unique_ptr<HostAdder> adder_;  // made at the first staged landing
  size_t max_range_ = 0;
  // The update's way back: two host staging buffers of the compute dtype (max_range_ each),
  // each with the compute stream's event after its last upload.
  HostBuffer<std::byte> up_staging_[2];
  Event up_done_[2];
  int slot_ = 0;  // the staging buffer the next upload uses
  // The update pending since offload_update, applied group by group as each is first used
  // (stale_: not yet); updated_mark_: the compute stream's point the uploads wait for; up_event_:
  // per group, the copy stream's event after its upload (acquire waits for it).
  GroupUpdate pending_;
  std::vector<bool> stale_;
  Event updated_mark_;
  std::vector<Event> up_event_;
  // parallel.offload_params: the compute copy's shards in host memory (s per group; adopted
  // from HostShards), and per group the copy stream's event after its host-to-device copy.
  bool offload_params_ = false;
  std::vector<HostBuffer<std::byte>> host_compute_;
  std::vector<Event> h2d_done_;
  Event compute_mark_;  // the compute stream's point a gather's copy waits for
  // The overlapped update: the compute stream's point it starts after; per group, the update
  // stream's event after its update and zeroed gradient, and whether the compute stream has yet
  // to wait for it; grads_zeroed_: the next begin_step leaves the gradients be.
  Event update_mark_;
  std::vector<Event> update_done_;
  std::vector<bool> update_pending_;
  bool grads_zeroed_ = false;
  Buffer<double> sumsq_;  // (1) the squared gradient norm being summed
  RankAgreement agree_;   // agree_recorded's, over the data group (where its ranks record)
};

}  // namespace ft
