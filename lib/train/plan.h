// `ft plan`: per-rank memory and communication of a recipe on a world of N ranks (DESIGN.md §3,
// §4), measured, not derived: for each rank position (pipeline stage × tensor rank × data rank)
// it builds the rank's real setup (train/setup.h: the model, ZeRO, the pipeline schedule, AdamW,
// the loss scaler) and runs one training step of placeholder tokens (train/step.h) on a counting
// device (runtime/counting_device.h: every allocation tallied by what it is for, nothing
// allocated, no kernel run) with counting communicators (comm/counting_communicator.h: the bytes
// each collective sends, nothing sent). So the figures are what the code that allocates asks for
// and they cannot drift from it; `ft train`'s memory check uses the same function for its rank.
// Host memory is counted the same way (Device::alloc_host, alloc_pageable: RankPlan's host_*).
// Nothing is read from disk (no weights, no shards: with model.from, the recipe's sizes came
// from its config.json, and the setup takes the reading path's buffers without reading) and
// nothing is written.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "recipe/recipe.h"
#include "runtime/device.h"

namespace ft {

// The device a plan is for. `ft plan` cannot see the GPU it will run on: `sm` is the compute
// capability it assumes (90 unless told), which sets the cuBLASLt workspace.
struct PlanDevice {
  bool cuda = false;
  int sm = 90;      // compute capability × 10 (80: A100, 90: H100)
  std::string why;  // how the device was chosen, for the notes ("runtime.device: cuda")
};

// One figure of a rank's plan: bytes, and what they are.
struct PlanFigure {
  int64_t bytes = 0;
  std::string how;
};

// One group's calls in a rank's counted step. `overlap_*`: the part ft's schedule issues while
// the backward still has work to do (DESIGN.md §3 "Overlap"): with parallel.overlap_comm, the
// data group's fp32 gradient reductions (ZeRO 0-1 all-reduces, 2-3 reduce-scatters) issued
// during the forward/backward, less the last group's (nothing of the backward is left after it).
struct GroupTraffic {
  std::string group;
  int size = 1;                  // ranks in the group
  int64_t bytes = 0, calls = 0;  // sent by this rank; calls that send (receives not counted)
  int64_t overlap_bytes = 0, overlap_calls = 0;  // of which may run under the backward
};

// The links and throughput a time estimate assumes (`ft plan` flags; defaults and their sources
// in DESIGN.md §4 "Communication time").
struct PlanLinks {
  int gpus_per_node = 8;     // rank r is on node r / gpus_per_node
  bool intra_pcie = false;   // the intra-node link is PCIe (default NVLink)
  double nvlink_gbps = 450;  // bus bandwidth per GPU, GB/s (1e9 B/s)
  double pcie_gbps = 50;
  double ib_gbps = 40;
  double latency_us = 20;  // per call
  double tflops = 400;     // achieved compute throughput, TFLOP/s
};

// One group's time in a rank's step: ms = bytes / bandwidth + calls × latency; hidden: the part
// that runs under the backward (at most the backward's compute time), exposed = ms − hidden.
struct GroupTime {
  std::string group, link;  // link: "NVLink", "PCIe" or "InfiniBand"
  int size = 1;
  double gbps = 0;
  int64_t bytes = 0, calls = 0;
  double ms = 0, hidden_ms = 0, exposed_ms = 0;
};

struct RankTime {
  double flops = 0;       // this rank's compute per step (model/layout FLOPs, DESIGN.md §4)
  double compute_ms = 0;  // flops / PlanLinks::tflops
  double window_ms = 0;   // the backward compute the overlapped reductions may hide under
  std::vector<GroupTime> groups;
  double comm_ms = 0, hidden_ms = 0, exposed_ms = 0;
  double step_ms = 0;  // compute + exposed communication
};

struct RankPlan {
  int rank = 0, data_rank = 0, stage = 0, tensor_rank = 0;
  int first_layer = 0, num_layers = 0;  // the layers this rank's pipeline stage holds
  bool embed = false, head = false;     // first stage (embeds) / last stage (norm, head, loss)
  std::string holds;                    // the parameter groups held, with element counts
  int64_t param_elems = 0;              // elements of the groups held (before ZeRO)
  int64_t trained_elems = 0;            // of those, the ones that train (not frozen)

  // Device memory live at the peak of a training step, by what it is for (MemoryCategory).
  PlanFigure params, grads, optim, activations, comm_buffers;
  PlanFigure backend;         // the backend's own buffers (CUDA: cuBLASLt workspace, ops' scratch)
  int64_t other_bytes = 0;    // allocations no MemoryScope claimed (none, or a bug)
  int64_t total_bytes = 0;    // the step's peak: the sum of the above
  int slots = 1;              // activation slots: micro-batches in flight (1F1B)
  int64_t startup_bytes = 0;  // the peak before the first step (building the setup)
  std::string startup_how;
  // The most parameter memory live at once while the setup is built: this rank's share, as no
  // rank builds more of the model than it keeps (train/setup.cpp).
  int64_t startup_params_bytes = 0;
  // The peak while one validation batch runs after the step (PipelineSchedule::eval_batch,
  // forward only, the global batch in eval_micro_batches micro-batches); 0 when the recipe does
  // not evaluate (data.valid or training.eval_every_steps unset).
  int64_t eval_bytes = 0;
  int eval_micro_batches = 0;
  // training.objective dpo with dpo.reference initial: the peak while the reference's
  // log-probabilities are computed before step 1 (this rank's batch, forward only); 0 otherwise.
  // (With reference base that pass runs inside every step, and the step's figures hold it.)
  int64_t reference_bytes = 0;
  int64_t peak_bytes = 0;   // max(total, startup, eval, reference)
  int64_t allocations = 0;  // alloc() calls counted, setup and step

  // Host memory (DESIGN.md §4 "Host memory"): what the rank's code takes through
  // Device::alloc_host (pinned: page-locked on CUDA) and Device::alloc_pageable, the most live
  // at once over the whole counted run (setup, steps, evaluation, a checkpoint save), each kind
  // by category at its own peak.
  using ByCategory = std::array<int64_t, size_t(MemoryCategory::kCount)>;
  PlanFigure host_pinned, host_pageable;
  ByCategory host_pinned_by{}, host_pageable_by{};
  int64_t host_peak_bytes = 0;  // pinned and pageable live at once
  // What the rank takes of its node's memory at most: host_peak_bytes; on the CPU device, whose
  // memory is host memory too, the most device and host memory live at once.
  int64_t host_need_bytes = 0;
  // The most host memory a node holding this rank needs: the host_need_bytes of its ranks
  // summed (plan_host; rank r on node r / gpus_per_node).
  int64_t host_node_bytes = 0;

  // Bytes this rank sends per optimizer step, by group.
  PlanFigure sent_data, sent_tensor, sent_pipeline, sent_world;
  int64_t sent_bytes = 0;  // the sum

  // The counted step's calls, per group of more than one rank, as the time estimate sorts them
  // (plan_times): "data", "tensor", "pipeline", "tied embedding", "world".
  std::vector<GroupTraffic> traffic;
  RankTime time;  // filled by plan_times
};

struct MemoryPlan {
  int world = 1, data = 1, tensor = 1, pipeline = 1, zero_stage = 0;
  int micro_batch = 1, accum = 1, seq_len = 1;
  bool activation_checkpointing = false;
  int64_t model_params = 0;        // elements of the whole model
  PlanDevice device;               // the device planned for
  std::vector<RankPlan> ranks;     // one per rank, in rank order
  std::vector<std::string> notes;  // what the figures leave out or assume
  // plan_host: ranks per node, and each node's host memory (its ranks' host_need_bytes summed).
  int gpus_per_node = 1;
  std::vector<int64_t> node_host_bytes;
};

// The plan for recipe r on `world` ranks (data = world / (tensor · pipeline)) of `device`.
// Throws ft::Error if the world does not divide into the recipe's layout.
MemoryPlan plan_memory(const Recipe& r, int world, const PlanDevice& device = {});
// One rank's figures (what `ft train` checks against the memory it has, before allocating).
RankPlan plan_rank(const Recipe& r, int world, int rank, const PlanDevice& device = {});

// A bound below one rank's memory that needs no counting run: its share of the fp32 parameters,
// gradients and AdamW moments, 16 B per element it holds / the data ranks (ZeRO-3 shards all
// four; lower stages hold more). ft train refuses a run this bound already rules out before
// counting it: a typo such as n_layers 10^9 would take as long to count as to build.
int64_t state_lower_bound_bytes(const Recipe& r, int world, int rank);
// Elements of the whole model (one tensor rank, every layer), without building its layout.
int64_t model_param_count(const ModelConfig& m);
// The most layers a model may have for the counting run (ft plan refuses more; the largest
// published models have some hundred).
inline constexpr int64_t kMaxCountedLayers = 100'000;

// What holds a rank's host memory of one kind, by category at its peak, for messages:
// "checkpoint.async's staging of the rank's weights and moments 46.1 GiB", or "none".
std::string describe_host_memory(const RankPlan::ByCategory& by, HostMemory kind);

// Sums each node's host memory (rank r on node r / gpus_per_node, as plan_times places them):
// fills plan.node_host_bytes and every rank's host_node_bytes.
void plan_host(MemoryPlan& plan, int gpus_per_node);

// Estimates each rank's step time from its counted calls (plan.ranks[*].traffic), the links
// and the compute throughput: fills plan.ranks[*].time and adds the model's notes.
void plan_times(MemoryPlan& plan, const Recipe& r, const PlanLinks& links);

// Ranks whose figures are all identical (same stage, same groups, same bytes), each list in rank
// order, lists ordered by their first rank.
std::vector<std::vector<int>> plan_roles(const MemoryPlan& plan);

// "0", "0-3", "0-1, 4-5": a sorted rank list in ranges.
std::string format_rank_list(const std::vector<int>& ranks);

}  // namespace ft
