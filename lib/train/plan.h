// `ft plan`: per-rank memory and communication estimate for a recipe on a world of N ranks
// (DESIGN.md §3, §4). A pure function of the recipe: nothing is allocated or run.
//
// The figures follow what the code allocates on the device for every layout it runs (data ×
// pipeline × tensor, ZeRO 0–3 over the data ranks): lib/model/llama.cpp (owns_group,
// ensure_acts), the ZeRO buffers of lib/parallel/zero.cpp, the pipeline buffers of
// lib/parallel/pipeline.cpp and the AdamW moments, so they match the measured
// mem_params/grads/optim_bytes and mem_peak_bytes (tests/cli/test_plan.sh). Tensor parallelism
// is Megatron's: column-split QKV/gate/up, row-split o/down, vocabulary-split embedding and
// lm_head (V/T rows each), norms replicated. Pipeline stage p holds stage_layers' contiguous
// even split of the layers (the first L mod P stages one extra), the embedding on the first
// stage and the final norm + head on the last (with tied embeddings the last stage holds the
// embedding group too); 1F1B keeps min(P − p, M) micro-batches in flight, each in a full
// activation slot of its own.
//
// Precision (training.precision) sets the bytes of activations and the compute copy; the
// device (PlanDevice) adds the CUDA backend's own buffers (lib/runtime/cuda/cuda_ops.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "recipe/recipe.h"

namespace ft {

// The device a plan is for. The CPU backend allocates nothing of its own on the device; the
// CUDA backend adds the cuBLASLt workspace and its ops' scratch, and its attention backward
// needs no fp32 dQ buffer. `ft plan` cannot see the GPU it will run on: `sm` is the compute
// capability it assumes (90 unless told), which sets the cuBLASLt workspace.
struct PlanDevice {
  bool cuda = false;
  int sm = 90;      // compute capability × 10 (80: A100, 90: H100)
  std::string why;  // how the device was chosen, for the notes ("runtime.device: cuda")
  // Attention on tensor cores (the default; FT_CUDA_ATTENTION=simt turns it off): its chunks
  // come from the ops' scratch (lib/runtime/cuda/attention_gemm.h).
  bool attention_gemm = true;
};

// One figure of a rank's plan: bytes, and how they were computed with this recipe's numbers.
struct PlanFigure {
  int64_t bytes = 0;
  std::string how;
};

struct RankPlan {
  int rank = 0, data_rank = 0, stage = 0, tensor_rank = 0;
  int first_layer = 0, num_layers = 0;  // the layers this rank's pipeline stage holds
  bool embed = false, head = false;     // first stage (embeds) / last stage (norm, head, loss)
  std::string holds;                    // the parameter groups held, with element counts
  int64_t param_elems = 0;              // elements of the groups held (before ZeRO)

  // Memory resident during a training step (device allocator bytes).
  PlanFigure params, grads, optim, activations, comm_buffers;
  PlanFigure backend;         // CUDA: cuBLASLt workspace + the ops' scratch; 0 on the CPU
  int64_t total_bytes = 0;    // the sum of the six: the peak during a step
  int slots = 1;              // activation slots: micro-batches in flight (1F1B)
  int64_t startup_bytes = 0;  // before the first step: whole model being sliced (T or P > 1), or
                              // full params + shards while ZeRO-3 shards them
  std::string startup_how;
  int64_t peak_bytes = 0;     // max(total, startup)

  // Bytes this rank sends per optimizer step.
  PlanFigure sent_data, sent_tensor, sent_pipeline;
  int64_t sent_bytes = 0;  // the sum of the three
};

struct MemoryPlan {
  int world = 1, data = 1, tensor = 1, pipeline = 1, zero_stage = 0;
  int micro_batch = 1, accum = 1, seq_len = 1;
  bool activation_checkpointing = false;
  int64_t model_params = 0;              // elements of the whole model
  PlanDevice device;                     // the device planned for
  std::vector<RankPlan> ranks;           // one per rank, in rank order
  std::vector<std::string> symbols;      // "N = B·S = 1·12 = 12 tokens per micro-batch", ...
  std::vector<std::pair<std::string, std::string>> formulas;  // (quantity, formula)
  std::vector<std::string> notes;        // what the estimate leaves out or assumes
};

// The plan for recipe r on `world` ranks (data = world / (tensor · pipeline)) of `device`.
// Throws ft::Error if the world does not divide into the recipe's layout.
MemoryPlan plan_memory(const Recipe& r, int world, const PlanDevice& device = {});

// The cuBLASLt workspace the CUDA backend allocates on a GPU of compute capability sm/10.x
// (lib/runtime/cuda/lt_gemm.h lt_workspace_bytes, which this must follow).
int64_t plan_lt_workspace_bytes(int sm);

// Ranks whose figures are all identical (same stage, same groups, same bytes), each list in rank
// order, lists ordered by their first rank.
std::vector<std::vector<int>> plan_roles(const MemoryPlan& plan);

// "0", "0-3", "0-1, 4-5": a sorted rank list in ranges.
std::string format_rank_list(const std::vector<int>& ranks);

}  // namespace ft
