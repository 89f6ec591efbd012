// A model's parameters as the parallel code sees them: flat fp32 groups (one per transformer
// block, plus the embedding and the head), each a run of tensors at fixed offsets, with how each
// tensor is split over the tensor-parallel ranks. The model describes its groups (its layout,
// model/layout.h) and owns one FlatParams holding them; ZeRO (zero.h) shards it, checkpoints
// slice it, and the model reads its parameters and writes its gradients through it while it
// runs. Nothing here knows the architecture.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/device.h"

namespace ft {

// How a tensor is divided over the tensor-parallel ranks (Megatron-LM, Shoeybi et al. 2019,
// tensor_parallel.h): column-parallel layers (q, k, v, gate, up) and the vocabulary-parallel
// embedding and lm_head split their output rows; row-parallel layers (o, down) split their input
// columns; norm weights are replicated.
enum class TensorSplit { kReplicated, kRows, kCols };

struct ParamEntry {
  std::string name;                   // Hugging Face name
  std::vector<int64_t> shape;         // this rank's shape, (out, in) for matrices
  std::vector<int64_t> global_shape;  // the whole tensor's shape
  TensorSplit split = TensorSplit::kReplicated;
  size_t offset = 0;  // in elements, within the group's flat buffer
  size_t numel = 0;
  bool weight_decay = false;  // true for tensors of two or more dimensions
  // Whether training updates it. Frozen tensors (an adapter's base, set by a model converter,
  // lib/adapt/) get no gradient, reduction, fp32 master or optimizer moments. A group trains as
  // a whole or not at all (ParamGroup::trains; FlatParams refuses a mixed group).
  bool trainable = true;
  // Held in NF4 (QLoRA's frozen base matrices, lib/adapt/lora.h): FlatParams keeps its 4-bit
  // codes and double-quantized block scales, and dequantizes it when its group is used.
  bool nf4 = false;
};

// Tensor rank t's slice of entry e (laid out for some number of tensor ranks) as runs of
// consecutive elements of the whole row-major tensor: fn(whole_offset, local_offset, count) for
// each run, in order. Replicated: one run, the whole tensor; kRows: one run, rank t's block of
// rows; kCols: one run per row, rank t's block of columns. HF loading reads a rank's slices
// with it and random init draws them (a kCols slice in one 2-D random_normal over the same
// elements), so that no rank builds a whole tensor it does not keep.
template <class Fn>
void for_each_slice_run(const ParamEntry& e, int t, Fn&& fn) {
  if (e.numel == 0) return;
  if (e.split == TensorSplit::kReplicated) {
    fn(size_t(0), size_t(0), e.numel);
  } else if (e.split == TensorSplit::kRows) {
    fn(size_t(t) * e.numel, size_t(0), e.numel);
  } else {
    const size_t rows = size_t(e.shape[0]), cols = size_t(e.shape[1]);
    const size_t whole_cols = size_t(e.global_shape[1]);
    for (size_t r = 0; r < rows; ++r) fn(r * whole_cols + size_t(t) * cols, r * cols, cols);
  }
}

struct ParamGroup {
  std::string name;  // "embed", "layers.3", "head"
  std::vector<ParamEntry> entries;
  size_t numel = 0;
  // An adapter's group (lib/adapt/): it runs with group attached_to, the block whose linear
  // layers it adapts: held by that group's pipeline stage, acquired and released with it, its
  // gradient complete when that block's backward is. The base model's files (model.from) do not
  // hold it. -1: a group of the model itself.
  int attached_to = -1;
  // Whether its entries train (all of them: FlatParams checks that they agree).
  bool trains() const { return entries.empty() || entries.front().trainable; }
};

// Where a group's parameters and gradients live while the model runs, when not in the
// FlatParams' own full buffers: ZeRO stages 2 and 3 (zero.h) gather a group's parameters just
// before it runs and release them after, and give it a working gradient buffer that is
// reduce-scattered as soon as the group's backward for the micro-batch is complete.
class GroupHooks {
 public:
  virtual ~GroupHooks() = default;
  virtual CRef acquire_params(int group) = 0;  // full parameters of the group (compute dtype)
  virtual void release_params(int group) = 0;
  virtual float* grads(int group) = 0;      // full-size, accumulate into it
  virtual void grads_ready(int group) = 0;  // this micro-batch's gradient is complete
  // How the next training micro-batch may be recorded as a graph and replayed
  // (LlamaModel::train_micro_batch). In both kinds that may, acquire_params, release_params and
  // grads only return the buffers they returned for the previous micro-batch.
  //   kNone: it may not (the hooks' device work changes from call to call).
  //   kHostOnly: grads_ready only counts on the host, no device work. Its calls are logged
  //     while recording (FlatParams::log_grads_ready) and made on the host after each launch.
  //   kCollectives: grads_ready also issues collectives on the communicator's stream (ZeRO 0-1's
  //     all-reduces under overlap_comm, ZeRO 2's reduce-scatters), which the communicator records
  //     into the graph (Communicator::records_in_graphs). The calls are made while recording,
  //     between begin_recording and, inside the recording, join_recorded, which orders the compute
  //     stream after the recorded collectives; a recording that fails is undone by
  //     recording_failed. Each launch goes through launch_collectives(launch, groups,
  //     recorded_now), which has the collective watchdog watch it, then makes the host's part of
  //     the calls logged (but after the launch that follows the recording, which made them).
  // With kNone, *why (where given) says why in words for the user, and whether it holds for the
  // rest of the run (lasting) or only until the hooks have seen a step (ZeRO 3's order).
  enum class Replay { kNone, kHostOnly, kCollectives };
  struct NoReplay {
    std::string reason;
    bool lasting = true;
  };
  virtual Replay micro_batch_replay(NoReplay* why = nullptr) const {
    if (why) *why = {"these ZeRO hooks are not recorded", true};
    return Replay::kNone;
  }
  virtual void begin_recording() {}
  virtual void join_recorded() {}
  virtual void recording_failed() {}
  // Whether other ranks' graphs may hold collectives this rank's calls meet (a data group over
  // a communicator that records into graphs): then a rank may not fall back to op by op alone,
  // since ranks that made the same all-reduces, some from graphs and some op by op, would pass
  // NCCL buffers registered by graph capture on some ranks only, which NCCL leaves undefined.
  // agree_recorded: after a recording attempt made on every rank at the same micro-batch,
  // whether `ok` holds on all of them (a collective where peers_record), so that all launch
  // graphs or none does.
  virtual bool peers_record() const { return false; }
  virtual bool agree_recorded(bool ok) { return ok; }
  virtual void launch_collectives(const std::function<void()>& launch,
                                  const std::vector<int>& groups, bool recorded_now) {
    (void)groups;
    (void)recorded_now;
    launch();
  }
  // No more micro-batches will be recorded in this run (a recording failed): what the hooks kept
  // for graphs may go (called after recording_failed, before the micro-batch runs op by op).
  virtual void graphs_off() {}
};

// Where a model group goes once its weights are written, when the FlatParams does not keep it
// (FlatParams::streamed): ZeRO-3's host shards under parallel.offload_params (zero.h HostShards).
// take(g, group, values): values is the whole group in fp32 on the device, valid during the call;
// the sink copies what it keeps. A group may be taken again (a later write replaces it).
class GroupSink {
 public:
  virtual ~GroupSink() = default;
  virtual void take(int g, const ParamGroup& group, const float* values) = 0;
};

class FlatParams {
 public:
  // groups: the model's layout (kept by reference: it outlives this). owned[g]: whether this
  // rank holds group g (its pipeline stage's); groups it does not hold are empty here.
  // compute_dtype: the precision policy's (DESIGN.md §5): the compute copy's element type.
  // Allocates (and zeroes) the fp32 buffer of every group held, except a frozen group's with a
  // 16-bit compute dtype: that one is held in the compute dtype only, from the start (an
  // adapter's base: 2 bytes a parameter, never 4; see write()).
  // sink (parallel.offload_params): every held group of the model itself (not an adapter's,
  // nor a quantized one) is streamed: no buffer of its own here; each is written whole into one
  // transient fp32 buffer and handed to the sink at group_written, then freed, so start-up holds
  // one group on the device, never the model. After that its parameters are ZeRO-3's (hooks).
  FlatParams(Device* dev, const std::vector<ParamGroup>& groups, std::vector<bool> owned,
             DType compute_dtype, GroupSink* sink = nullptr);
  ~FlatParams();
  FlatParams(const FlatParams&) = delete;
  FlatParams& operator=(const FlatParams&) = delete;

  const std::vector<ParamGroup>& groups() const { return groups_; }
  bool owns(int g) const { return owned_[size_t(g)]; }
  DType compute_dtype() const { return cdt_; }
  // Whether group g is held in the compute dtype only (frozen, 16-bit compute dtype, not
  // quantized): it has no fp32 buffer in params(), and is set through write() / upload_group().
  bool compute_only(int g) const;
  // Whether group g (held) has NF4 entries (ParamEntry::nf4; QLoRA, lib/adapt/lora.h). Such a
  // group is held as the NF4 codes of those entries (4 bits an element, in blocks of 64), their
  // blocks' absmaxes double-quantized to 8 bits (in groups of 256, an fp32 scale each, and one
  // mean per tensor: kernels/nf4.h), and its other entries (norms, biases) in the compute dtype.
  // It is written whole into a compute-dtype buffer (write(), then group_written(), which
  // quantizes it and frees the buffer: one group at a time, so start-up holds one group
  // unquantized), and compute_params() / acquire() dequantize it into one buffer that all such
  // groups share: the model uses one block's group at a time (asking for another overwrites it).
  bool quantized(int g) const;
  // Whether group g is streamed to the sink (see the constructor).
  bool streamed(int g) const;
  // The end of group g's writes: a quantized group is quantized now (no-op for the others).
  // upload_group calls it; a caller of write() calls it once the group is whole.
  void group_written(int g);

  // The fp32 buffer of each group (numel of group g, 0 for groups not held or compute_only):
  // initialised by the model, and the parameters it computes with in fp32. With a 16-bit compute
  // dtype they exist only until make_compute_copy(); ZeRO then keeps the fp32 master weights.
  std::vector<Buffer<float>>& params() { return params_; }
  // Sets elements [offset, offset + n) of group g from fp32 values made on the device by
  // make(dst, begin, count), which writes the values of the group's elements
  // [offset + begin, offset + begin + count) to dst. A group with an fp32 buffer: one call,
  // straight into it. A compute_only group: calls of at most kStagingElems elements (whole
  // multiples of `unit`, so that a 2-D draw is cut between rows; n a multiple of it) into an fp32
  // staging buffer, each piece converted into the compute copy as make_compute_copy would.
  static constexpr size_t kStagingElems = size_t(16) << 20;  // 64 MiB of fp32
  // Tests cut the pieces small, to write a tiny model in several.
  void set_staging_elems(size_t n) { staging_elems_ = std::max<size_t>(1, n); }
  void write(int g, size_t offset, size_t n, size_t unit,
             const std::function<void(float* dst, size_t begin, size_t count)>& make);
  // Group g (its numel) from fp32 values on the host, through write(), then group_written().
  void upload_group(int g, const float* host);
  // 16-bit compute dtype: converts the fp32 buffers into compute-dtype ones, group by group,
  // freeing each fp32 buffer once converted (compute_only groups have theirs already). No-op in
  // fp32.
  void make_compute_copy();
  // The parameters group g is computed with: the compute copy, or the fp32 buffer in fp32.
  Ref compute_params(int g);
  // Frees the full parameter buffers once ZeRO-3 owns the parameters as shards.
  void drop_params();
  // Full gradient buffers, fp32, allocated (zeroed) on first use: ZeRO-2/3 runs never need them.
  // A frozen group's is empty.
  std::vector<Buffer<float>>& grads();
  void zero_grads();  // the full gradient buffers, if any (hooks zero their own)
  // Bytes of the parameter buffers held (fp32 and compute copy).
  size_t param_bytes() const;
  // Host copies of the groups in fp32 (empty for groups not held; a compute_only group's values
  // widened from the compute dtype, exactly; a quantized group's dequantized), and back (through
  // upload_group): for loading and slicing weights in tests and tools. The rank setup loads group
  // by group instead.
  std::vector<std::vector<float>> to_host();
  void from_host(const std::vector<std::vector<float>>& host);

  // What the model calls while it runs: through the hooks when set (ZeRO 2/3), else the full
  // buffers above. acquire/release bracket a group's use of its parameters.
  void set_hooks(GroupHooks* hooks) { hooks_ = hooks; }
  bool has_hooks() const { return hooks_ != nullptr; }
  // The quantized group whose values the shared dequantized buffer holds (-1: none, or unknown);
  // acquiring it again queues no dequantization. A recorded graph replays the dequantizations it
  // recorded, whatever this says: so the model records from -1 and, after each launch, sets the
  // value the recording ended with (LlamaModel::train_micro_batch).
  int dequantized_group() const { return dequantized_group_; }
  void set_dequantized_group(int g) { dequantized_group_ = g; }
  // After a pass that stopped midway (a graph recording that failed): no quantized group held,
  // none known to be dequantized.
  void reset_quantized_holds() {
    held_refs_ = 0;
    held_group_ = -1;
    dequantized_group_ = -1;
  }
  // A quantized group's dequantized values live in the one shared buffer: acquiring another
  // quantized group while one is held is refused (it would overwrite what is in use).
  CRef acquire(int g) {
    if (quantized(g)) hold_quantized(g);
    return hooks_ ? hooks_->acquire_params(g) : CRef(compute_params(g));
  }
  void release(int g) {
    if (hooks_) hooks_->release_params(g);
    if (quantized(g) && --held_refs_ == 0) held_group_ = -1;
  }
  // Null for a frozen group: the model computes no gradient for its weights.
  float* grad(int g) {
    if (!groups_[size_t(g)].trains()) return nullptr;
    return hooks_ ? hooks_->grads(g) : grads()[size_t(g)].data();
  }
  void grads_ready(int g) {
    if (!hooks_ || !groups_[size_t(g)].trains()) return;
    if (ready_log_) ready_log_->push_back(g);
    if (!ready_log_ || make_logged_) hooks_->grads_ready(g);
  }
  GroupHooks* hooks() const { return hooks_; }
  // How the next training micro-batch may be replayed from a graph (GroupHooks::Replay); without
  // hooks as kHostOnly, with no calls at all.
  GroupHooks::Replay micro_batch_replay(GroupHooks::NoReplay* why = nullptr) const {
    return hooks_ ? hooks_->micro_batch_replay(why) : GroupHooks::Replay::kHostOnly;
  }
  // While `log` is set (a micro-batch being recorded as a graph), the hooks' grads_ready calls
  // are appended to it, and made too where `make` (kCollectives: their collectives go into the
  // recording). kHostOnly logs them only: make_ready_calls then makes them after each launch of
  // the graph (the first included), so a recording that fails leaves the hooks as they were,
  // and the micro-batch runs op by op. Null: made at once, not logged.
  void log_grads_ready(std::vector<int>* log, bool make) {
    ready_log_ = log;
    make_logged_ = make;
  }
  void make_ready_calls(const std::vector<int>& groups) {
    if (groups.empty()) return;
    FT_CHECK(hooks_, "grads_ready calls to make, but no hooks are set");
    for (const int g : groups) hooks_->grads_ready(g);
  }

 private:
  Device* dev_;
  const std::vector<ParamGroup>& groups_;
  std::vector<bool> owned_;
  DType cdt_;
  std::vector<Buffer<float>> params_, grads_;
  // 16-bit compute dtype: the compute copy (a group each; compute_only groups' from the start,
  // the others' from make_compute_copy, when made_ is set; none for quantized groups).
  std::vector<DBuffer> compute_params_;
  bool made_ = false;
  // Quantized groups (null for the others), the group being written before it is quantized,
  // and the one dequantized buffer.
  struct Nf4Group;
  std::vector<std::unique_ptr<Nf4Group>> nf4_;
  DBuffer building_;
  int building_group_ = -1;
  DBuffer dequantized_;
  int dequantized_group_ = -1;
  // Streamed groups: the sink, and the one group being written (fp32, whole).
  GroupSink* sink_ = nullptr;
  Buffer<float> building32_;
  int building32_group_ = -1;
  int held_group_ = -1, held_refs_ = 0;  // the quantized group acquired, and how many times
  Ref dequantize(int g);
  void hold_quantized(int g);
  size_t staging_elems_ = kStagingElems;
  GroupHooks* hooks_ = nullptr;
  std::vector<int>* ready_log_ = nullptr;  // log_grads_ready
  bool make_logged_ = false;
};

}  // namespace ft
