#include "train/setup.h"

#include <algorithm>
#include <vector>

#include "ckpt/hf.h"
#include "core/log.h"
#include "parallel/partition.h"
#include "parallel/tensor_parallel.h"

namespace ft {
namespace {

// The whole model is initialised (or loaded from model.from) the same way for every layout,
// then each tensor rank keeps its slices: so every layout starts from the same weights.
void init_weights(LlamaModel& model, const Recipe& r, Device* dev, const Mesh& mesh,
                  WeightSource source, bool is_root) {
  std::unique_ptr<LlamaModel> whole;
  LlamaModel* init = &model;
  if (mesh.tensor > 1 || mesh.pipeline > 1) {
    const MemoryScope tag(MemoryCategory::kParameters);
    whole = std::make_unique<LlamaModel>(r.model, dev);
    init = whole.get();
  }
  if (source == WeightSource::kShapesOnly) return;  // the whole model was there, and is freed
  // Weights are read and sliced on the host, then copied to the device.
  auto host_ptrs = [](std::vector<std::vector<float>>& h) {
    std::vector<float*> p;
    for (auto& g : h) p.push_back(g.empty() ? nullptr : g.data());
    return p;
  };
  if (source == WeightSource::kHuggingFace) {
    if (is_root) log_info("loading weights from ", r.model.from);
    std::vector<std::vector<float>> host = init->flat_params().to_host();
    load_hf_weights(r.model.from, init->layout(), host_ptrs(host));
    init->flat_params().from_host(host);
  } else {
    init->init_random(r.run.seed, r.model.init_std);
  }
  if (whole) {
    std::vector<std::vector<float>> src = whole->flat_params().to_host();
    std::vector<std::vector<float>> dst = model.flat_params().to_host();
    const std::vector<float*> sp = host_ptrs(src);
    slice_for_tensor_rank(whole->layout().groups(), std::vector<const float*>(sp.begin(), sp.end()),
                          model.layout().groups(), host_ptrs(dst), mesh.t);
    model.flat_params().from_host(dst);
  }
}

}  // namespace

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
  s.model = std::make_unique<LlamaModel>(r.model, dev, r.training.activation_checkpointing,
                                         groups.tensor, stage, compute_dtype_of(r));
  init_weights(*s.model, r, dev, mesh, weights, is_root);
  // ZeRO over the data group (lib/parallel/zero.h) takes over the parameters (stage 3) and
  // gradients (stages 2, 3) from the model.
  ZeroOptions zero_options;
  zero_options.overlap = r.parallel.overlap_comm;
  zero_options.prefetch_blocks = r.parallel.prefetch_blocks;
  zero_options.reduce_dtype = r.parallel.reduce_dtype == "bf16" ? DType::kBF16 : DType::kF32;
  zero_options.bucket_elems =
      std::max<size_t>(1, size_t(r.parallel.reduce_bucket_mb * double(1 << 20)) / sizeof(float));
  s.zero =
      std::make_unique<ZeroSharding>(r.parallel.zero_stage, s.model->flat_params(), *groups.data,
                                     dev, groups.tensor, groups.pipeline, zero_options);
  // Tied embeddings across stages: the first stage's embedding and the last stage's head are one
  // matrix held twice; their gradients are summed between the two (DESIGN.md §3).
  if (groups.tied_holders) s.zero->share_group(0, groups.tied_holders);
  s.pipeline = std::make_unique<PipelineSchedule>(*s.model, groups.pipeline, dev);
  s.optim = std::make_unique<AdamW>(s.model->layout(), r.optimizer, dev, s.zero->ranges());
  // fp16 only: the loss scale and its counters (optim/loss_scaler.h, DESIGN.md §5).
  if (r.training.precision == "fp16") s.scaler.emplace(loss_scaler_config(r.training));
  return s;
}

}  // namespace ft
