#include "train/setup.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <vector>

#include "adapt/freeze.h"
#include "adapt/lora.h"
#include "ckpt/hf.h"
#include "core/log.h"
#include "core/progress.h"
#include "parallel/partition.h"

namespace ft {
namespace {

// Each rank initialises (or loads from model.from) only what it holds: its pipeline stage's
// groups, and of each tensor its tensor rank's slice. The random init draws every element from
// (seed, tensor name, index in the whole tensor), and the import reads the slices out of the
// whole tensors in the files, so every layout starts from the same weights without any rank
// building the whole model (DESIGN.md §2, "Parameter init").
// ft plan (kShapesOnly) runs the random init on its counting device, which draws nothing: that
// counts the staging buffer a frozen group is written through (FlatParams::write), as loading
// model.from allocates the same. With model.from it takes the reading path's buffers instead,
// reading nothing (a folder with config.json alone plans).
void init_weights(LlamaModel& model, const Recipe& r, const Mesh& mesh, WeightSource source,
                  bool is_root) {
  const bool from_folder = source == WeightSource::kHuggingFace ||
                           (source == WeightSource::kShapesOnly && !r.model.from.empty());
  if (!from_folder) {
    model.init_random(r.run.seed, r.model.init_std);
    return;
  }
  // Weights are read on the host, this rank's share only, a group at a time (the host holds one
  // group in fp32, not the stage), then copied to the device. The buffer fits the largest group
  // and is the Device's pageable host memory, so that the run's metrics (mem_host_pageable_bytes)
  // and ft plan count it: for a large vocabulary the embedding's share is gigabytes.
  std::optional<HfWeightReader> reader;
  if (source == WeightSource::kHuggingFace) {
    if (is_root) log_info("loading weights from ", r.model.from);
    reader.emplace(r.model.from, model.layout());
  }
  const auto& groups = model.layout().groups();
  auto read_here = [&](size_t g) { return model.owns_group(int(g)) && groups[g].attached_to < 0; };
  size_t most = 0;
  double total = 0;  // this rank's parameters
  for (size_t g = 0; g < groups.size(); ++g)
    if (read_here(g)) {
      most = std::max(most, groups[g].numel);
      total += double(groups[g].numel);
    }
  const MemoryScope tag(MemoryCategory::kParameters);
  HostBuffer<float> host(model.device(), most, HostMemory::kPageable);
  // Rank 0 shows its share's progress (core/progress.h): minutes for a large model on a slow disk.
  WorkProgress progress("loading weights", total, WorkProgress::Unit::kItems, "parameters",
                        is_root && reader.has_value());
  double done = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!read_here(g)) continue;
    if (reader) {
      std::fill(host.data(), host.data() + groups[g].numel, 0.0f);
      reader->read_group(int(g), host.data(), mesh.t);
    }
    model.flat_params().upload_group(int(g), host.data());
    done += double(groups[g].numel);
    progress.update(done, groups[g].name);
  }
  progress.finish();
}

}  // namespace

ModelConverters model_converters(const Recipe& r) {
  ModelConverters out;
  if (r.adapter.type == "lora" || r.adapter.type == "qlora")
    out.push_back(std::make_unique<LoraConverter>(r.adapter));
  if (const char* freeze = std::getenv("FT_TEST_FREEZE"); freeze && *freeze) {
    std::vector<std::string> names;
    std::stringstream list(freeze);
    for (std::string n; std::getline(list, n, ',');)
      if (!n.empty()) names.push_back(n);
    out.push_back(std::make_unique<FreezeGroups>(std::move(names)));
  }
  return out;
}

ParamLayout checkpoint_layout(const Recipe& r) {
  const ModelConverters converters = model_converters(r);
  return converted_layout(r.model, 1, &converters);
}

DType compute_dtype_of(const Recipe& r) {
  return r.training.precision == "bf16"   ? DType::kBF16
         : r.training.precision == "fp16" ? DType::kF16
                                          : DType::kF32;
}

RankSetup build_rank_setup(const Recipe& r, Device* dev, const Mesh& mesh,
                           const DeviceGroups& groups, WeightSource weights, bool is_root) {
  RankSetup s;
  const StageSpec stage = pipeline_stage(r.model.n_layers, mesh.p, mesh.pipeline);
  // Precision policy (DESIGN.md §5): activations and the parameters' compute copy in the compute
  // dtype; fp32 master weights, moments and gradients.
  s.converters = model_converters(r);
  if (r.parallel.offload_params == "cpu")
    s.host_shards = std::make_unique<HostShards>(dev, groups.data->size(), groups.data->rank(),
                                                 compute_dtype_of(r));
  s.model =
      std::make_unique<LlamaModel>(r.model, dev, r.training.activation_checkpointing, groups.tensor,
                                   stage, compute_dtype_of(r), &s.converters, s.host_shards.get());
  s.model->set_loss_chunk_tokens(r.training.loss_chunk_tokens);
  bool frozen = false;
  for (const ParamGroup& g : s.model->layout().groups()) frozen = frozen || !g.trains();
  if (frozen && weights == WeightSource::kRandom && !r.model.from.empty())
    weights = WeightSource::kHuggingFace;  // a resume: the checkpoint lacks the frozen groups
  init_weights(*s.model, r, mesh, weights, is_root);
  for (const auto& c : s.converters) c->convert_model(*s.model, r.run.seed);
  if (!r.adapter.from.empty() && weights != WeightSource::kShapesOnly) {
    // The adapter to start from (a resume reads the trained one from the checkpoint after).
    if (is_root) log_info("loading the adapter from ", r.adapter.from);
    // Only the adapter's groups and the model's trained whole (modules_to_save) travel through
    // the host, not the frozen base.
    const auto& groups = s.model->layout().groups();
    std::vector<std::vector<float>> host(groups.size());
    std::vector<float*> ptrs(groups.size(), nullptr);
    for (size_t g = 0; g < groups.size(); ++g)
      if ((groups[g].attached_to >= 0 || groups[g].trains()) && s.model->owns_group(int(g))) {
        host[g].resize(groups[g].numel);
        ptrs[g] = host[g].data();
      }
    load_peft_adapter(r.adapter.from, s.model->layout(), ptrs, mesh.t);
    for (size_t g = 0; g < groups.size(); ++g)
      if (ptrs[g]) s.model->flat_params().upload_group(int(g), ptrs[g]);
  }
  // ZeRO over the data group (lib/parallel/zero.h) takes over the parameters (stage 3) and
  // gradients (stages 2, 3) from the model.
  ZeroOptions zero_options;
  zero_options.overlap = r.parallel.overlap_comm;
  zero_options.overlap_update = r.parallel.overlap_update;
  zero_options.prefetch_blocks = r.parallel.prefetch_blocks;
  zero_options.reduce_dtype = r.parallel.reduce_dtype == "bf16" ? DType::kBF16 : DType::kF32;
  zero_options.offload_optimizer = r.parallel.offload_optimizer == "cpu";
  zero_options.host_shards = s.host_shards.get();
  zero_options.graphs = s.model->may_record_graphs() && r.training.objective != "dpo";
  zero_options.bucket_elems =
      std::max<size_t>(1, size_t(r.parallel.reduce_bucket_mb * double(1 << 20)) / sizeof(float));
  s.zero =
      std::make_unique<ZeroSharding>(r.parallel.zero_stage, s.model->flat_params(), *groups.data,
                                     dev, groups.tensor, groups.pipeline, zero_options);
  // Tied embeddings across stages: the first stage's embedding and the last stage's head are one
  // matrix held twice; their gradients are summed between the two (DESIGN.md §3).
  if (groups.tied_holders) s.zero->share_group(0, groups.tied_holders);
  s.pipeline = std::make_unique<PipelineSchedule>(*s.model, groups.pipeline, dev);
  s.optim = std::make_unique<AdamW>(s.model->layout(), r.optimizer, dev, s.zero->ranges(),
                                    s.zero->offloaded());
  // fp16 only: the loss scale and its counters (optim/loss_scaler.h, DESIGN.md §5).
  if (r.training.precision == "fp16") s.scaler.emplace(loss_scaler_config(r.training));
  return s;
}

}  // namespace ft
