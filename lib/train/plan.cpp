#include "train/plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "ckpt/checkpoint.h"
#include "comm/counting_communicator.h"
#include "comm/device_comm.h"
#include "core/error.h"
#include "model/layout.h"
#include "parallel/partition.h"
#include "runtime/counting_device.h"
#include "train/metrics.h"
#include "train/setup.h"
#include "train/step.h"
#include "train/train_state.h"

namespace ft {
namespace {

// 1234567 -> "1,234,567"
std::string count(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string layer_range(int first, int n) {
  return n == 1 ? "layer " + std::to_string(first)
                : "layers " + std::to_string(first) + "-" + std::to_string(first + n - 1);
}

// The groups this rank holds, as the model and its layout say.
std::string describe_holds(const LlamaModel& m, bool tied, bool embed, bool head) {
  const FlatParams& f = m.flat_params();
  const auto& groups = f.groups();
  const int L = m.config().n_layers;
  int64_t sum = 0, first = -1, layers = 0, layer_numel = 0, adapter = 0;
  for (int g = 0; g < int(groups.size()); ++g) {
    if (!f.owns(g)) continue;
    sum += int64_t(groups[size_t(g)].numel);
    if (groups[size_t(g)].attached_to >= 0) adapter += int64_t(groups[size_t(g)].numel);
    if (g >= 1 && g <= L) {
      if (first < 0) first = g - 1;
      ++layers;
      layer_numel = int64_t(groups[size_t(g)].numel);
    }
  }
  std::string h;
  if (f.owns(0)) {
    h += "embedding " + count(int64_t(groups[0].numel));
    if (!embed) h += " (the tied lm_head, also held by the first stage)";
    h += " + ";
  }
  h += layer_range(int(first), int(layers)) + " (" + std::to_string(layers) + " × " +
       count(layer_numel) + ")";
  if (head) {
    // The head group, and the final norm's own when lm_head trains apart from it (layout.h).
    int64_t n = int64_t(groups[size_t(L) + 1].numel);
    if (const int ng = m.layout().final_norm().group; ng != L + 1)
      n += int64_t(groups[size_t(ng)].numel);
    h += std::string(tied ? " + final norm " : " + norm and lm_head ") + count(n);
  }
  if (tied && embed && head) h += " (lm_head tied to the embedding)";
  if (adapter > 0) h += " + their adapters " + count(adapter);
  return h + " = " + count(sum) + " elements";
}

// A counting communicator (its bytes are the counting one's) that also notes, per call, what the
// time estimate needs (plan_times): how many calls send, and which are gradient reductions
// issued while the backward goes on. `reduction`: the kind of call that reduces the data
// group's gradients (ZeRO 0-1 all-reduce, 2-3 reduce-scatter); kKinds for the other groups, and
// without parallel.overlap_comm (every reduction waits for the whole backward, or is waited for
// at once).
class RecordingCommunicator final : public Communicator {
 public:
  struct Call {
    int64_t bytes = 0;
    bool overlap = false;
  };
  RecordingCommunicator(int size, int rank, std::string name,
                        CountingCommunicator::Kind reduction = CountingCommunicator::kKinds)
      : counting(size, rank, name), name_(std::move(name)), reduction_(reduction) {}
  int rank() const override { return counting.rank(); }
  int size() const override { return counting.size(); }
  bool records_in_graphs() const override { return counting.records_in_graphs(); }
  CommWork all_reduce(Stream s, Ref data, size_t n, ReduceOp op) override {
    const int64_t before = counting.sent_bytes();
    CommWork w = counting.all_reduce(s, data, n, op);
    note(before, CountingCommunicator::kAllReduce, data.dtype);
    return w;
  }
  CommWork reduce_scatter(Stream s, CRef in, Ref out, size_t shard) override {
    const int64_t before = counting.sent_bytes();
    CommWork w = counting.reduce_scatter(s, in, out, shard);
    note(before, CountingCommunicator::kReduceScatter, in.dtype);
    return w;
  }
  CommWork all_gather(Stream s, CRef in, Ref out, size_t shard) override {
    const int64_t before = counting.sent_bytes();
    CommWork w = counting.all_gather(s, in, out, shard);
    note(before, CountingCommunicator::kAllGather, in.dtype);
    return w;
  }
  CommWork broadcast(Stream s, Ref data, size_t n, int root) override {
    const int64_t before = counting.sent_bytes();
    CommWork w = counting.broadcast(s, data, n, root);
    note(before, CountingCommunicator::kBroadcast, data.dtype);
    return w;
  }
  CommWork send(Stream s, CRef data, size_t n, int peer, int tag) override {
    const int64_t before = counting.sent_bytes();
    CommWork w = counting.send(s, data, n, peer, tag);
    note(before, CountingCommunicator::kSend, data.dtype);
    return w;
  }
  CommWork recv(Stream s, Ref data, size_t n, int peer, int tag) override {
    return counting.recv(s, data, n, peer, tag);  // its time is the send's
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { counting.abort(code); }
  std::string describe() const override { return counting.describe(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return counting.split(color, key);
  }
  void reset() {
    counting.reset();
    calls.clear();
  }
  // The group's calls of the step, the last `tail` overlapping ones counted as not overlapping
  // (the reduction of the group the backward finishes last: nothing is left to hide it).
  GroupTraffic traffic(int64_t tail) const {
    GroupTraffic t;
    t.group = name_;
    t.size = counting.size();
    int64_t left = tail;
    for (auto it = calls.rbegin(); it != calls.rend(); ++it) {
      t.bytes += it->bytes;
      ++t.calls;
      if (it->overlap && left > 0) {
        --left;
      } else if (it->overlap) {
        t.overlap_bytes += it->bytes;
        ++t.overlap_calls;
      }
    }
    return t;
  }

  CountingCommunicator counting;
  std::vector<Call> calls;

 private:
  void note(int64_t before, CountingCommunicator::Kind kind, DType dtype) {
    if (counting.size() > 1)
      calls.push_back({counting.sent_bytes() - before,
                       kind == reduction_ && dtype != DType::kF64 &&
                           std::strcmp(watch_step().phase, "forward/backward") == 0});
  }
  std::string name_;
  CountingCommunicator::Kind reduction_;
};

std::string sent_how(const CountingCommunicator& c, const char* none) {
  std::string h;
  for (int k = 0; k < CountingCommunicator::kKinds; ++k) {
    const auto kind = CountingCommunicator::Kind(k);
    if (c.sent_bytes(kind) == 0) continue;
    if (!h.empty()) h += " + ";
    h +=
        std::string(CountingCommunicator::kind_name(kind)) + " " + count(c.sent_bytes(kind)) + " B";
  }
  return h.empty() ? none : h + " (group of " + std::to_string(c.size()) + ")";
}

// How many of a micro-batch's tokens the head's logits hold at once (training.loss_chunk_tokens).
std::string head_chunk_words(const Recipe& r) {
  const int64_t n = int64_t(r.training.micro_batch_size) * r.data.seq_len *
                    (r.training.objective == "dpo" ? 2 : 1);
  const int64_t k = r.training.loss_chunk_tokens;
  if (k == 0 || k >= n) return "of the whole micro-batch (" + std::to_string(n) + " tokens)";
  return "for " + std::to_string(k) + " of the micro-batch's " + std::to_string(n) +
         " tokens at a time";
}

// What each category holds, in this recipe's terms (the bytes are counted, this only says what).
void describe(RankPlan& rp, const Recipe& r, const PlanDevice& device, int D, int P) {
  const int zs = r.parallel.zero_stage;
  const std::string& prec = r.training.precision;
  const bool mixed = prec != "fp32", sharded = D > 1;
  if (zs >= 3 && sharded)
    rp.params.how = mixed ? "fp32 master shards and their " + prec + " copy (ZeRO-3)"
                          : "fp32 shards (ZeRO-3; a group is gathered only while it runs)";
  else if (zs >= 1 && sharded && mixed)
    rp.params.how = "fp32 masters of the owned ranges + the " + prec + " copy of every group";
  else
    rp.params.how = mixed ? "fp32 masters + their " + prec + " copy" : "fp32, every group whole";
  rp.grads.how = zs >= 2 ? "fp32 shards (each micro-batch's group gradient reduce-scattered in)"
                         : "fp32, every group whole";
  rp.optim.how = zs >= 1 && sharded ? "AdamW m and v (fp32) of the owned ranges, its constants"
                                    : "AdamW m and v (fp32) of every group, its constants";
  // Offload (DESIGN.md §3 "Offload"): the state the host holds (its host pinned figure).
  if (r.parallel.offload_optimizer == "cpu") {
    rp.params.how = r.parallel.offload_params == "cpu"
                        ? "none held: each group gathered for its use only (fp32 masters and the " +
                              prec + " shards in host memory)"
                        : "the " + prec + " copy" +
                              std::string(zs >= 3 && sharded ? " shards" : "") +
                              " (fp32 masters in host memory)";
    if (!mixed && r.parallel.offload_params != "cpu")
      rp.params.how = "the fp32 copy computed with (fp32 masters in host memory)";
    rp.grads.how = zs >= 2 ? "none: each micro-batch's group gradient goes to host memory"
                           : "fp32, every group whole (its owned range copied to host memory)";
    rp.optim.how = "none: AdamW m and v in host memory";
  }
  if (rp.trained_elems < rp.param_elems) {  // a model converter froze groups
    rp.grads.how += "; none for frozen groups";
    rp.optim.how += "; none for frozen groups";
    if (r.adapter.type == "qlora")
      rp.params.how += "; frozen blocks: NF4 matrices (0.52 B/element) + one block dequantized";
    else if (mixed)
      rp.params.how += "; frozen groups: the " + prec + " copy only";
  }
  rp.activations.how =
      std::to_string(rp.slots) + (rp.slots == 1 ? " slot" : " slots") +
      (P > 1 ? " (micro-batches in flight)" : "") + ": the micro-batch's tokens, " +
      (r.training.activation_checkpointing ? "the layer inputs and one recomputed layer"
                                           : "every layer's activations") +
      (rp.head ? ", the head's logits " + head_chunk_words(r) : "") + ", the backward's buffers" +
      (mixed ? " (" + prec + "; statistics fp32)" : "");
  std::string comm;
  if ((zs == 1 || zs == 2) && sharded) comm = "ZeRO's all-gather buffer";
  if (zs >= 2)  // one data rank too: the group's gradient before it is added in (or offloaded)
    comm += std::string(comm.empty() ? "" : ", ") + (zs == 3 ? "gathered parameters and " : "") +
            "working gradients live at the peak";
  if (P > 1) comm += std::string(comm.empty() ? "" : ", ") + "pipeline send/receive buffers";
  rp.comm_buffers.how = comm.empty() ? "none" : comm;
  rp.backend.how = device.cuda ? "cuBLASLt workspace (sm_" + std::to_string(device.sm) +
                                     ") + the ops' shared scratch"
                               : "none: the CPU backend allocates nothing of its own";
  // Host memory, by what asked for it.
  auto host_how = [&](const RankPlan::ByCategory& by, HostMemory kind) {
    std::string h = describe_host_memory(by, kind);
    if (h != "none" && kind == HostMemory::kPinned)
      h += device.cuda ? "; page-locked (cudaMallocHost)" : "; plain memory on the CPU device";
    return h;
  };
  rp.host_pinned.how = host_how(rp.host_pinned_by, HostMemory::kPinned);
  rp.host_pageable.how = host_how(rp.host_pageable_by, HostMemory::kPageable);
}

}  // namespace

std::string describe_host_memory(const RankPlan::ByCategory& by, HostMemory kind) {
  std::string h;
  for (int c = 0; c < int(MemoryCategory::kCount); ++c) {
    if (by[size_t(c)] == 0) continue;
    const auto cat = MemoryCategory(c);
    std::string what = memory_category_name(cat);
    if (cat == MemoryCategory::kCheckpoint)
      what = kind == HostMemory::kPinned
                 ? "checkpoint.async's staging of the rank's weights and moments"
                 : "a synchronous save's copy of its largest piece";
    else if (cat == MemoryCategory::kParameters && kind == HostMemory::kPageable)
      what = "model.from's weights, read a group at a time at start-up";
    h += (h.empty() ? "" : " + ") + what + " " + Progress::human_bytes(double(by[size_t(c)]));
  }
  return h.empty() ? "none" : h;
}

int64_t model_param_count(const ModelConfig& m) {
  ModelConfig one = m;
  one.n_layers = 1;
  const ParamLayout layout(one);
  return int64_t(layout.embed().numel) + int64_t(m.n_layers) * int64_t(layout.block(0).numel) +
         int64_t(layout.head().numel);
}

int64_t state_lower_bound_bytes(const Recipe& r, int world, int rank) {
  const int T = r.parallel.tensor, P = r.parallel.pipeline;
  FT_CHECK(world > 0 && T > 0 && P > 0 && world % (T * P) == 0, "world size ", world,
           " is not divisible by tensor × pipeline = ", T * P);
  const int64_t D = world / (T * P), p = (rank / T) % P;
  const LayerRange layers = stage_layers(r.model.n_layers, int(p), P);
  const bool head = p == P - 1, embed = p == 0 || (head && r.model.tie_embeddings);
  const ModelConverters converters = model_converters(r);
  if (converters.empty()) {
    // The real layout of one layer (model/layout.h), times this stage's layers: 16 B an element
    // (f32 parameter, gradient, two moments), cut D ways at best. One layer, not all: this
    // bound is what refuses a model of a million layers before anything is built for it.
    ModelConfig one = r.model;
    one.n_layers = 1;
    const ParamLayout layout(one, T);
    const int64_t held = (embed ? int64_t(layout.embed().numel) : 0) +
                         int64_t(layers.size()) * int64_t(layout.block(0).numel) +
                         (head ? int64_t(layout.head().numel) : 0);
    return 16 * ((held + D - 1) / D);
  }
  // With model converters (frozen groups), the converted layout, group by group: the compute
  // dtype's size for a frozen element, half a byte for an NF4 one (QLoRA).
  const ParamLayout layout = converted_layout(r.model, T, &converters);
  const int64_t frozen_size = int64_t(dtype_size(compute_dtype_of(r)));
  int64_t bytes = 0;
  auto add = [&](const ParamGroup& g) {
    if (g.trains()) {
      bytes += 16 * ((int64_t(g.numel) + D - 1) / D);
      return;
    }
    int64_t held = 0;
    for (const ParamEntry& e : g.entries)
      held += e.nf4 ? (int64_t(e.numel) + 1) / 2 : frozen_size * int64_t(e.numel);
    bytes += (held + D - 1) / D;  // ZeRO-3 shards a frozen group too (not a QLoRA one)
  };
  if (embed) add(layout.embed());
  for (int l = layers.first; l < layers.last; ++l) add(layout.block(l));
  if (head) add(layout.head());
  return bytes;
}

std::string format_rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

RankPlan plan_rank(const Recipe& r, int world, int rank, const PlanDevice& device) {
  const int T = r.parallel.tensor, P = r.parallel.pipeline;
  FT_CHECK(world > 0 && T > 0 && P > 0 && world % (T * P) == 0, "world size ", world,
           " is not divisible by tensor × pipeline = ", T * P);
  FT_CHECK(rank >= 0 && rank < world, "rank ", rank, " of a world of ", world);
  const int D = world / (T * P);
  // The setup builds the layout of every layer (names included) on every rank.
  if (r.model.n_layers > kMaxCountedLayers)
    throw UsageError(detail::concat(
        "ft plan builds each rank's model to count it: ", r.model.n_layers,
        " layers are more than it builds (", kMaxCountedLayers, "); check model.n_layers"));
  RankPlan rp;
  rp.rank = rank;
  rp.tensor_rank = rank % T;
  rp.stage = (rank / T) % P;
  rp.data_rank = rank / (T * P);

  // This rank's place in the mesh (DESIGN.md §3), each group a counting communicator.
  Mesh mesh;
  mesh.data = D;
  mesh.pipeline = P;
  mesh.tensor = T;
  mesh.d = rp.data_rank;
  mesh.p = rp.stage;
  mesh.t = rp.tensor_rank;
  const int zs = r.parallel.zero_stage;
  const auto reduction = !r.parallel.overlap_comm ? CountingCommunicator::kKinds
                         : zs >= 2                ? CountingCommunicator::kReduceScatter
                                                  : CountingCommunicator::kAllReduce;
  auto* data = new RecordingCommunicator(D, mesh.d, "data", reduction);
  auto* tensor = new RecordingCommunicator(T, mesh.t, "tensor");
  auto* pipe = new RecordingCommunicator(P, mesh.p, "pipeline");
  mesh.data_comm.reset(data);
  mesh.tensor_comm.reset(tensor);
  mesh.pipeline_comm.reset(pipe);
  RecordingCommunicator world_comm(world, rank, "world");
  std::unique_ptr<RecordingCommunicator> holders;
  if (P > 1 && r.model.tie_embeddings && (mesh.p == 0 || mesh.p == P - 1))
    holders = std::make_unique<RecordingCommunicator>(2, mesh.p == 0 ? 0 : 1, "tied embedding");
  DeviceGroups groups{data, T > 1 ? tensor : nullptr, P > 1 ? pipe : nullptr, holders.get()};
  // On GPUs with NCCL (as ft train would choose it, comm/device_comm.h) calls stay in flight
  // until waited on, and their buffers with them: the plan counts that memory too.
  const bool nccl =
      device.cuda && nccl_backend() &&
      (r.runtime.communicator == "nccl" || (r.runtime.communicator == "auto" && world > 1));
  for (RecordingCommunicator* c : {data, tensor, pipe, holders.get()})
    if (c) c->counting.set_in_flight(nccl);

  CountingDevice dev(CountingTarget{device.cuda ? DeviceKind::kCuda : DeviceKind::kCpu, device.sm});
  // The step's collectives name their phase to the watchdog: leave it as the caller had it
  // (ft train plans its own rank at start-up).
  const WatchStep watch = watch_step();
  RankSetup s = build_rank_setup(r, &dev, mesh, groups, WeightSource::kShapesOnly, false);
  rp.startup_bytes = dev.tally().peak;
  const int64_t startup_params = dev.tally().get(MemoryCategory::kParameters);
  rp.startup_params_bytes = dev.tally().high[size_t(MemoryCategory::kParameters)];

  // The checkpoints' host memory, through the writer's own code (ckpt/checkpoint.h) as ft train
  // takes it (train/checkpoint_policy.cpp): checkpoint.async's staging buffer is reserved once
  // the setup is built and held from then on; a synchronous save holds a copy of its largest
  // piece while it writes (after the step, below). Nothing is written.
  const bool saves = r.checkpoint.every_steps > 0 || r.checkpoint.every_minutes > 0;
  std::vector<ckpt::PieceSource> pieces;
  if (saves) pieces = state_pieces(*s.model, *s.zero, *s.optim, mesh);
  std::optional<ckpt::CheckpointWriter> writer;
  if (saves && r.checkpoint.async) {
    ckpt::CheckpointWriter::Options wo;
    wo.async = true;
    wo.staging_device = &dev;
    writer.emplace(wo);
    writer->reserve(pieces);
  }

  // One step of placeholder tokens (id 0, every target trained) on this data rank's share of
  // the global batch; the figures are the step's. ZeRO-3 with prefetch records the order of the
  // groups in the first step and prefetches from the second on (parallel/zero.h): a first step
  // runs uncounted, so that the counted one is a steady-state step.
  const bool warm_up = r.parallel.zero_stage == 3 && r.parallel.prefetch_blocks > 0;
  const int micro = r.training.micro_batch_size, S = r.data.seq_len;
  const int accum = grad_accum_steps(r, world);
  // DPO: a sample is a pair, two rows (train/dpo.h); the objective in the head as ft train
  // installs it, and a table of placeholder reference values for reference: initial.
  const bool dpo = r.training.objective == "dpo";
  const int rows = dpo ? 2 : 1;
  std::optional<DpoRun> dpo_run;
  if (dpo) dpo_run.emplace(r, *s.model, *s.pipeline);
  StepSamples batch;
  batch.count = rows * micro * accum;
  batch.seq_len = S;
  batch.inputs.assign(size_t(batch.count) * S, 0);
  batch.targets.assign(size_t(batch.count) * S, 0);
  batch.mask.assign(size_t(batch.count) * S, 1);
  if (r.data.pack) batch.seg.assign(size_t(batch.count) * S, 0);  // the model's seg/pos buffers
  if (dpo) {
    for (int p = 0; p < micro * accum; ++p) batch.pair_index.push_back(uint64_t(p));
    dpo_run->train_table.assign(size_t(batch.count), 0.0);
    dpo_run->valid_table.assign(size_t(2 * r.training.global_batch_size), 0.0);
  }
  TrainStep step(r, world_comm, *data, P > 1 ? pipe : nullptr, *s.model, *s.zero, *s.pipeline,
                 *s.optim, s.scaler_ptr());
  if (dpo) step.dpo = &*dpo_run;
  // reference: initial, before step 1: this rank's batch forward only, as
  // DpoRun::reference_table runs it, its peak on its own.
  if (dpo && r.dpo.reference == "initial") {
    dev.reset_peak();
    dpo_run->objective().collect(0, size_t(batch.count));
    s.pipeline->eval_batch(batch, rows * micro);
    rp.reference_bytes = dev.tally().peak;
  }
  if (warm_up)
    step.run_batch(
        0, batch, [] { return LoopRequests{}; }, std::chrono::steady_clock::now());
  dev.reset_peak();
  for (RecordingCommunicator* c : {data, tensor, pipe, &world_comm}) c->reset();
  if (holders) holders->reset();
  step.run_batch(
      warm_up ? 1 : 0, batch, [] { return LoopRequests{}; }, std::chrono::steady_clock::now());
  set_watch_step(watch.step, watch.phase, watch.long_wait);

  const MemoryTally& t = dev.tally();
  rp.params.bytes = t.get(MemoryCategory::kParameters);
  rp.grads.bytes = t.get(MemoryCategory::kGradients);
  rp.optim.bytes = t.get(MemoryCategory::kOptimizer);
  rp.activations.bytes = t.get(MemoryCategory::kActivations);
  rp.comm_buffers.bytes = t.get(MemoryCategory::kCommunication);
  rp.backend.bytes = t.get(MemoryCategory::kScratch);
  rp.other_bytes = t.get(MemoryCategory::kOther);
  rp.total_bytes = t.peak;
  rp.peak_bytes = std::max(rp.total_bytes, rp.startup_bytes);
  rp.allocations = t.allocs;
  rp.slots = s.pipeline->slots();
  rp.startup_how = startup_params > rp.params.bytes
                       ? "while the parameters are built: ZeRO sharding them"
                       : "while the setup is built";

  const LlamaModel& m = *s.model;
  const StageSpec& st = m.stage();
  rp.first_layer = st.first_layer;
  rp.num_layers = st.last_layer - st.first_layer;
  rp.embed = st.embed;
  rp.head = st.head;
  for (int g = 0; g < int(m.layout().groups().size()); ++g) {
    if (!m.flat_params().owns(g)) continue;
    const ParamGroup& group = m.layout().groups()[size_t(g)];
    rp.param_elems += int64_t(group.numel);
    if (group.trains()) rp.trained_elems += int64_t(group.numel);
  }
  rp.holds = describe_holds(m, r.model.tie_embeddings, st.embed, st.head);

  rp.sent_data = {data->counting.sent_bytes(), sent_how(data->counting, "one data rank")};
  rp.sent_tensor = {tensor->counting.sent_bytes(), sent_how(tensor->counting, "one tensor rank")};
  rp.sent_pipeline = {pipe->counting.sent_bytes() + (holders ? holders->counting.sent_bytes() : 0),
                      sent_how(pipe->counting, "one pipeline stage")};
  if (holders)
    rp.sent_pipeline.how += "; tied embedding with the " +
                            std::string(mesh.p == 0 ? "last" : "first") +
                            " stage: " + sent_how(holders->counting, "nothing");
  rp.sent_world = {world_comm.counting.sent_bytes(),
                   sent_how(world_comm.counting, "one rank") +
                       (world > 1 ? ": the step's agreement (stop, save, non-finite)" : "")};
  rp.sent_bytes =
      rp.sent_data.bytes + rp.sent_tensor.bytes + rp.sent_pipeline.bytes + rp.sent_world.bytes;
  // The last gradient reduction of the backward: the lowest group this rank holds (the
  // backward ends there), in calls of at most the bucket at ZeRO 0-1, one reduce-scatter at 2-3.
  int64_t tail = 0;
  for (int g = 0; g < int(m.flat_params().groups().size()); ++g) {
    const int64_t n = int64_t(m.flat_params().groups()[size_t(g)].numel);
    if (!m.flat_params().owns(g) || n == 0 || !m.flat_params().groups()[size_t(g)].trains())
      continue;
    const int64_t bucket =
        std::max<int64_t>(1, int64_t(r.parallel.reduce_bucket_mb * double(1 << 20)) / 4);
    tail = zs >= 2 ? 1 : (n + bucket - 1) / bucket;
    break;
  }
  for (const RecordingCommunicator* c : {data, tensor, pipe, holders.get(), &world_comm})
    if (c && c->size() > 1) rp.traffic.push_back(c->traffic(c == data ? tail : 0));

  // Evaluation (data.valid, every training.eval_every_steps), after the step as ft train runs
  // it (train/trainer.cpp evaluate): one validation batch through PipelineSchedule::eval_batch,
  // the global batch's samples in micro-batches on every data rank (the validation loader
  // serves each rank the whole batch), forward only; under pipeline parallelism through the
  // stages with their receives and sends. Its peak is counted on its own (the step's figures
  // above stay the step's); what it sends is not part of the step's traffic.
  if (!r.data.valid.empty() && r.training.eval_every_steps > 0) {
    StepSamples eval;
    eval.count = rows * r.training.global_batch_size;
    eval.seq_len = S;
    eval.inputs.assign(size_t(eval.count) * S, 0);
    eval.targets.assign(size_t(eval.count) * S, 0);
    eval.mask.assign(size_t(eval.count) * S, 1);
    if (r.data.pack) eval.seg.assign(size_t(eval.count) * S, 0);
    if (dpo) {
      for (int p = 0; p < r.training.global_batch_size; ++p) eval.pair_index.push_back(uint64_t(p));
      dpo_run->prepare(eval, /*valid=*/true);
    }
    dev.reset_peak();
    s.pipeline->eval_batch(eval, rows * micro);
    rp.eval_bytes = dev.tally().peak;
    rp.eval_micro_batches = eval.count / (rows * micro);
    rp.peak_bytes = std::max(rp.peak_bytes, rp.eval_bytes);
  }
  rp.peak_bytes = std::max(rp.peak_bytes, rp.reference_bytes);
  if (saves && !r.checkpoint.async) ckpt::CheckpointWriter::piece_copy(pieces);  // held, freed

  // Host memory: the counting device's host tallies span the whole run (reset_peak leaves them).
  const MemoryTally& pinned = dev.host_tally(HostMemory::kPinned);
  const MemoryTally& pageable = dev.host_tally(HostMemory::kPageable);
  rp.host_pinned.bytes = pinned.peak;
  rp.host_pinned_by = pinned.at_peak;
  rp.host_pageable.bytes = pageable.peak;
  rp.host_pageable_by = pageable.at_peak;
  rp.host_peak_bytes = dev.host_tally().peak;
  rp.host_need_bytes = device.cuda ? rp.host_peak_bytes : dev.combined_peak();
  describe(rp, r, device, D, P);
  return rp;
}

MemoryPlan plan_memory(const Recipe& r, int world, const PlanDevice& device) {
  MemoryPlan plan;
  plan.world = world;
  plan.device = device;
  plan.tensor = r.parallel.tensor;
  plan.pipeline = r.parallel.pipeline;
  plan.zero_stage = r.parallel.zero_stage;
  FT_CHECK(world > 0 && plan.tensor > 0 && plan.pipeline > 0 &&
               world % (plan.tensor * plan.pipeline) == 0,
           "world size ", world,
           " is not divisible by tensor × pipeline = ", plan.tensor * plan.pipeline);
  plan.data = world / (plan.tensor * plan.pipeline);
  plan.micro_batch = r.training.micro_batch_size;
  plan.seq_len = r.data.seq_len;
  plan.accum = grad_accum_steps(r, world);
  plan.activation_checkpointing = r.training.activation_checkpointing;
  plan.model_params = model_param_count(r.model);
  // Ranks whose counting runs would be the same run are counted once: tensor ranks hold equal
  // slices (the layout requires the split to divide) and their coordinate changes no size, and
  // data ranks differ only in the ZeRO ranges they own. So the key is the pipeline stage and the
  // owned range of each group the stage holds.
  if (r.model.n_layers > kMaxCountedLayers) plan_rank(r, world, 0, device);  // refuses it
  const ParamLayout layout(r.model, plan.tensor);
  std::map<std::pair<int, std::vector<size_t>>, size_t> counted;  // key -> index in plan.ranks
  for (int rank = 0; rank < world; ++rank) {
    const int p = (rank / plan.tensor) % plan.pipeline, d = rank / (plan.tensor * plan.pipeline);
    const StageSpec st = pipeline_stage(r.model.n_layers, p, plan.pipeline);
    std::vector<size_t> owned;
    for (int g = 0; g < int(layout.groups().size()); ++g) {
      const int L = r.model.n_layers;
      const bool holds = g == 0       ? st.embed || (st.head && r.model.tie_embeddings)
                         : g == L + 1 ? st.head
                                      : g - 1 >= st.first_layer && g - 1 < st.last_layer;
      if (holds) owned.push_back(zero_shard(layout.groups()[size_t(g)].numel, plan.data, d).size());
    }
    const auto [it, fresh] =
        counted.emplace(std::make_pair(p, std::move(owned)), plan.ranks.size());
    if (fresh) {
      plan.ranks.push_back(plan_rank(r, world, rank, device));
      continue;
    }
    RankPlan same = plan.ranks[it->second];
    same.rank = rank;
    same.tensor_rank = rank % plan.tensor;
    same.data_rank = d;
    plan.ranks.push_back(std::move(same));
  }

  plan.notes.push_back(
      "Measured: each rank's setup and one training step ran on a counting device, which tallies "
      "every allocation by what it is for and allocates nothing (figures are the allocator's "
      "requests, as mem_peak_bytes counts them); total is the step's peak, startup the peak "
      "while the setup is built.");
  plan.notes.push_back(
      r.training.precision == "fp32"
          ? std::string("training.precision fp32: 4 bytes per element throughout.")
          : "training.precision " + r.training.precision +
                ": activations and the parameters' compute copy 2 bytes per element; fp32 "
                "master weights, gradients, AdamW moments, norm and attention statistics 4.");
  if (device.cuda) {
    char sm[64];
    std::snprintf(sm, sizeof sm, "sm_%d", device.sm);
    plan.notes.push_back(
        "Planned for the CUDA device (" + device.why + "), assuming a GPU of " + sm +
        " (ft plan cannot see the GPU; --cuda-sm 80 for an A100: 4 MiB cuBLASLt workspace "
        "instead of 32).");
    plan.notes.push_back(
        "cudaMalloc'd memory (AllocatorStats reserved, what nvidia-smi shows) is above the "
        "requests by the allocator's rounding: each block to 512 B, small blocks carved from "
        "2 MiB segments, large ones in segments rounded to 2 MiB; allow 2 MiB per buffer size in "
        "use at once, plus the CUDA context (some hundreds of MiB per GPU, outside both).");
  } else {
    plan.notes.push_back(
        std::string("Planned for the CPU device (") +
        (device.why.empty() ? "runtime.device: cpu" : device.why) +
        "). Only device-allocator memory is counted, as mem_peak_bytes counts it: the data "
        "loader, MPI and the process itself come on top.");
  }
  {
    // Checkpoints: every rank writes 1/D of the groups it holds, 12 bytes per element (f32
    // parameters + two AdamW moments), at any ZeRO stage; async saves stage that in host memory.
    // Frozen groups are not saved (DESIGN.md §8).
    int64_t largest = 0;
    for (const RankPlan& rp : plan.ranks) largest = std::max(largest, rp.trained_elems);
    const int64_t share = 12 * ((largest + plan.data - 1) / plan.data);
    int64_t trained = plan.model_params, frozen = 0;
    if (!model_converters(r).empty()) {  // the whole layout only then: plans of 100,000 layers
      const ParamLayout saved = checkpoint_layout(r);
      trained = 0;
      for (const ParamGroup& g : saved.groups())
        (g.trains() ? trained : frozen) += int64_t(g.numel);
    }
    const int64_t whole = 12 * trained;
    char sizes[96];
    std::snprintf(sizes, sizeof sizes, "%.1f MiB in all, up to %.1f MiB", double(whole) / 1048576.0,
                  double(share) / 1048576.0);
    plan.notes.push_back(detail::concat(
        "A checkpoint holds 12 B per parameter (f32 weights + AdamW moments)",
        frozen ? ", frozen ones not saved" : "", ": ", sizes, " written by one rank",
        r.checkpoint.async
            ? (device.cuda ? "; checkpoint.async keeps a page-locked host (not device) staging "
                             "buffer of that share per rank."
                           : "; checkpoint.async keeps a host (not device) staging buffer of that "
                             "share per rank.")
            : "."));
  }
  plan.notes.push_back(
      std::string("Host memory is counted as device memory is: what each rank's code takes "
                  "through Device::alloc_host (pinned: page-locked on CUDA; plain memory on the "
                  "CPU device) and Device::alloc_pageable (model.from's weights, read a group at "
                  "a time at start-up; a synchronous checkpoint save's copy of a piece), the most "
                  "live at once over the setup, a step, evaluation and a save. Left out, being "
                  "small or not the model's: the data loader's batches (data.prefetch + 1 steps "
                  "of tokens, targets and masks), the safetensors reader's 16 MiB chunks, a "
                  "resume's read of one piece at a time, MPI's and NCCL's own buffers") +
      (device.cuda ? ", MPI's host staging of GPU memory (runtime.communicator mpi: one "
                     "page-locked buffer as large as the largest collective), the CUDA context"
                   : "") +
      " and the process itself (code, libraries: some hundreds of MiB)." +
      (device.cuda ? ""
                   : " On the CPU device the device memory above is host memory too: a rank's "
                     "host need is the most of both live at once."));
  if (!r.data.valid.empty() && r.training.eval_every_steps > 0)
    plan.notes.push_back(
        "Evaluation: the peak while one validation batch runs after the step (data.valid, every "
        "training.eval_every_steps): every data rank runs the whole global batch, " +
        std::to_string(r.training.global_batch_size / r.training.micro_batch_size) +
        " forward-only micro-batches one at a time, in the step's activation slot 0 (logits "
        "included) and, with pipeline stages, the step's send and receive buffers; peak is the "
        "largest of the step's, start-up's and evaluation's.");
  else
    plan.notes.push_back(
        "No evaluation planned (data.valid or training.eval_every_steps unset): the peak is the "
        "larger of the step's and start-up's.");
  return plan;
}

void plan_times(MemoryPlan& plan, const Recipe& r, const PlanLinks& links) {
  FT_CHECK(links.gpus_per_node >= 1 && links.nvlink_gbps > 0 && links.pcie_gbps > 0 &&
               links.ib_gbps > 0 && links.latency_us >= 0 && links.tflops > 0,
           "ft plan: GPUs per node, bandwidths and TFLOP/s must be positive");
  const int D = plan.data, P = plan.pipeline, T = plan.tensor, W = plan.world;
  const ModelConfig& m = r.model;
  // Multiply-accumulates per token of one layer's and the head's matrices (scripts/bench.py's
  // count: q, k, v, o and the SwiGLU's three), and of attention's two T×T products, over the
  // tensor ranks (heads and ffn columns are split; the head's vocabulary too).
  const double C = m.dim, hd = double(m.dim / m.n_heads), HD = m.n_heads * hd,
               KD = m.n_kv_heads * hd, F = m.ffn_dim, V = m.vocab_size, S = plan.seq_len;
  const double layer = (C * HD + 2 * C * KD + HD * C + 3 * C * F) / T, head = V * C / T;
  const double attention = 2 * S * HD / T;  // QKᵀ and PV, per token and layer (not halved: causal)
  // DPO: two rows (chosen, rejected) per pair; with reference: base a forward pass more a step
  // (the reference's, the adapter off).
  const bool dpo = r.training.objective == "dpo";
  const double tokens = double(plan.micro_batch) * plan.accum * plan.seq_len * (dpo ? 2 : 1);
  auto node = [&](int rank) { return rank / links.gpus_per_node; };
  for (RankPlan& rp : plan.ranks) {
    RankTime& t = rp.time;
    t = RankTime{};
    // Forward 2 FLOPs per multiply-accumulate, backward twice the forward; activation
    // checkpointing runs the layers' forward once more during the backward.
    const double layers_fwd = 2 * rp.num_layers * (layer + attention) * tokens;
    const double fwd = layers_fwd + (rp.head ? 2 * head * tokens : 0);
    const double bwd = 2 * fwd + (plan.activation_checkpointing ? layers_fwd : 0);
    t.flops = fwd + bwd + (dpo && r.dpo.reference == "base" ? fwd : 0);
    t.compute_ms = t.flops / (links.tflops * 1e12) * 1e3;
    // The reductions left in flight during the backward: ZeRO 0-1 issue them in the last
    // micro-batch's, 2-3 in every micro-batch's.
    t.window_ms = (r.parallel.overlap_comm ? bwd / (plan.zero_stage >= 2 ? 1 : plan.accum) : 0) /
                  (links.tflops * 1e12) * 1e3;
    double window = t.window_ms;
    for (const GroupTraffic& g : rp.traffic) {
      // The group's ranks, from this rank's coordinates (rank = (d·P + p)·T + t).
      const int d = rp.data_rank, p = rp.stage, tr = rp.tensor_rank;
      std::vector<int> ranks;
      if (g.group == "data")
        for (int x = 0; x < D; ++x) ranks.push_back((x * P + p) * T + tr);
      else if (g.group == "tensor")
        for (int x = 0; x < T; ++x) ranks.push_back((d * P + p) * T + x);
      else if (g.group == "pipeline")
        for (int x = 0; x < P; ++x) ranks.push_back((d * P + x) * T + tr);
      else if (g.group == "tied embedding")
        ranks = {(d * P) * T + tr, (d * P + P - 1) * T + tr};
      else
        for (int x = 0; x < W; ++x) ranks.push_back(x);
      bool across = false;
      for (int x : ranks) across = across || node(x) != node(ranks.front());
      GroupTime gt;
      gt.group = g.group;
      gt.size = g.size;
      gt.link = across ? "InfiniBand" : links.intra_pcie ? "PCIe" : "NVLink";
      gt.gbps = across ? links.ib_gbps : links.intra_pcie ? links.pcie_gbps : links.nvlink_gbps;
      gt.bytes = g.bytes;
      gt.calls = g.calls;
      auto ms = [&](int64_t bytes, int64_t calls) {
        return double(bytes) / (gt.gbps * 1e9) * 1e3 + double(calls) * links.latency_us / 1e3;
      };
      gt.ms = ms(g.bytes, g.calls);
      gt.hidden_ms = std::min(ms(g.overlap_bytes, g.overlap_calls), window);
      window -= gt.hidden_ms;
      gt.exposed_ms = gt.ms - gt.hidden_ms;
      t.comm_ms += gt.ms;
      t.hidden_ms += gt.hidden_ms;
      t.exposed_ms += gt.exposed_ms;
      t.groups.push_back(std::move(gt));
    }
    t.step_ms = t.compute_ms + t.exposed_ms;
  }
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "Time (predicted from the counted bytes, not measured): a group's call takes the "
                "bytes this rank "
                "sends (above) / the link's bus bandwidth + %g us; a group within one node of "
                "%d GPUs uses %s (%g GB/s), one spanning nodes InfiniBand (%g GB/s) for all of "
                "it (a ring is as slow as its slowest link). Compute: FLOPs / %g TFLOP/s "
                "(achieved, not peak). Step = compute + exposed communication.",
                links.latency_us, links.gpus_per_node, links.intra_pcie ? "PCIe" : "NVLink",
                links.intra_pcie ? links.pcie_gbps : links.nvlink_gbps, links.ib_gbps,
                links.tflops);
  plan.notes.push_back(buf);
  plan.notes.push_back(
      r.parallel.overlap_comm
          ? std::string(
                "Hidden: the data group's gradient reductions issued during the backward "
                "(parallel.overlap_comm; ZeRO 0-1: the last micro-batch's, 2-3: every "
                "micro-batch's), up to the backward's compute time; the last group's reduction, "
                "ZeRO-1/2's parameter all-gather after the update, ZeRO-3's all-gathers (their "
                "prefetch's overlap is not modelled), tensor all-reduces, pipeline sends and the "
                "step's agreement are exposed.")
          : std::string("Hidden: nothing (parallel.overlap_comm false): every call is exposed."));
  if (P > 1)
    plan.notes.push_back(
        "With pipeline stages the step also waits for the pipeline's bubble (about (P - 1) / "
        "(M + P - 1) of it idle), which the predicted time leaves out.");
}

void plan_host(MemoryPlan& plan, int gpus_per_node) {
  FT_CHECK(gpus_per_node >= 1, "ft plan: GPUs per node must be positive");
  plan.gpus_per_node = gpus_per_node;
  plan.node_host_bytes.assign(size_t((plan.world + gpus_per_node - 1) / gpus_per_node), 0);
  for (const RankPlan& rp : plan.ranks)
    plan.node_host_bytes[size_t(rp.rank / gpus_per_node)] += rp.host_need_bytes;
  for (RankPlan& rp : plan.ranks)
    rp.host_node_bytes = plan.node_host_bytes[size_t(rp.rank / gpus_per_node)];
}

std::vector<std::vector<int>> plan_roles(const MemoryPlan& plan) {
  // Ranks whose groups use different links are different roles (the bytes are the same).
  auto links_key = [](const RankPlan& r) {
    std::string k;
    for (const GroupTime& g : r.time.groups) k += g.group + ":" + g.link + ";";
    return k;
  };
  auto key = [&links_key](const RankPlan& r) {
    return std::make_tuple(r.stage, r.first_layer, r.num_layers, r.embed, r.head, r.holds,
                           r.params.bytes, r.grads.bytes, r.optim.bytes, r.activations.bytes,
                           r.comm_buffers.bytes, r.backend.bytes, r.other_bytes, r.total_bytes,
                           r.startup_bytes, r.startup_params_bytes, r.eval_bytes, r.reference_bytes,
                           r.host_pinned_by, r.host_pageable_by, r.host_peak_bytes,
                           r.host_need_bytes, r.sent_data.bytes, r.sent_data.how,
                           r.sent_tensor.bytes, r.sent_tensor.how, r.sent_pipeline.bytes,
                           r.sent_pipeline.how, r.sent_world.bytes, links_key(r));
  };
  std::vector<std::vector<int>> roles;
  std::map<decltype(key(plan.ranks.front())), size_t> index;
  for (const RankPlan& r : plan.ranks) {
    auto [it, fresh] = index.emplace(key(r), roles.size());
    if (fresh) roles.emplace_back();
    roles[it->second].push_back(r.rank);
  }
  return roles;
}

}  // namespace ft
