// What one rank trains with: the model part of its pipeline stage and tensor rank, ZeRO over its
// data group, the pipeline schedule, AdamW and (fp16) the loss scaler, built in one order by
// one function. `ft train` builds them on the run's device with the mesh's communicators;
// `ft plan` (plan.h) builds the very same on a counting device with counting communicators,
// so that the plan is what this code allocates.
#pragma once

#include <memory>
#include <optional>

#include "comm/communicator.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "parallel/pipeline.h"
#include "parallel/zero.h"
#include "recipe/recipe.h"
#include "runtime/device.h"

namespace ft {

// The communicators the model, ZeRO and the pipeline exchange device memory over (host-staged
// where the host cannot read the device's memory, comm/host_staging.h); null: a group of one.
struct DeviceGroups {
  Communicator* data = nullptr;  // never null: ZeRO's group, of one rank without data parallelism
  Communicator* tensor = nullptr;
  Communicator* pipeline = nullptr;
  // Tied embeddings across pipeline stages: the first and last stage's pair (null elsewhere).
  Communicator* tied_holders = nullptr;
};

// Where the weights come from: drawn (run.seed, model.init_std), loaded from model.from, or
// nothing at all (ft plan: the buffers exist with their sizes, no value is computed or read).
enum class WeightSource { kRandom, kHuggingFace, kShapesOnly };

struct RankSetup {
  ModelConverters converters;  // model/converter.h: applied to the model in this order
  // parallel.offload_params: where the model's groups stream as their weights are written
  // (parallel/zero.h), before ZeRO takes them over; null otherwise.
  std::unique_ptr<HostShards> host_shards;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ZeroSharding> zero;
  std::unique_ptr<PipelineSchedule> pipeline;
  std::unique_ptr<AdamW> optim;
  std::optional<LossScaler> scaler;  // fp16 only
  LossScaler* scaler_ptr() { return scaler ? &*scaler : nullptr; }
};

// The precision policy's compute dtype (DESIGN.md §5): fp32, bf16 or fp16.
DType compute_dtype_of(const Recipe& r);

// The recipe's model converters (model/converter.h), in the order they apply. None yet from the
// recipe itself (adapters come with issue 28). Test support, not a user feature:
// FT_TEST_FREEZE=embed,layers.0,... freezes those parameter groups (lib/adapt/freeze.h).
ModelConverters model_converters(const Recipe& r);
// The layout a checkpoint's tensors follow: the model's at tensor size 1, with the converters'
// layout halves applied (which groups are frozen).
ParamLayout checkpoint_layout(const Recipe& r);

// Builds this rank's objects in the order their memory is allocated by a run: the model (its
// parameters, then their weights: this rank's share only, drawn or read in place, never the
// whole model), ZeRO (masters, shards, the compute copy), the schedule, AdamW's moments, the loss
// scaler. is_root: rank 0 says what it loads.
// weights: where the parameters come from. A checkpoint holds no frozen parameters, so when a
// converter freezes some, a resumed run (kRandom with model.from) reads model.from again.
RankSetup build_rank_setup(const Recipe& r, Device* dev, const Mesh& mesh,
                           const DeviceGroups& groups, WeightSource weights, bool is_root);

}  // namespace ft
