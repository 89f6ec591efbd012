#include "optim/adamw.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/log.h"

namespace ft {

AdamW::AdamW(const ParamLayout& layout, const OptimizerConfig& cfg, Device* dev,
             std::vector<ShardRange> ranges, bool on_host)
    : layout_(layout),
      cfg_(cfg),
      dev_(dev),
      ranges_(std::move(ranges)),
      on_host_(on_host),
      ops_(on_host ? dev->host_ops() : dev->ops()) {
  const auto& groups = layout.groups();
  if (ranges_.empty())
    for (const auto& g : groups) ranges_.push_back({0, g.numel});
  FT_CHECK(ranges_.size() == groups.size(), "AdamW: ", ranges_.size(), " ranges for ",
           groups.size(), " groups");
  const MemoryScope tag(MemoryCategory::kOptimizer);
  if (!on_host_) args_ = Buffer<kernels::AdamwArgs>(dev, 2);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].trains()) ranges_[g] = {ranges_[g].begin, ranges_[g].begin};  // frozen
    const ShardRange& r = ranges_[g];
    if (on_host_) {
      host_m_.emplace_back(dev, r.size());
      host_v_.emplace_back(dev, r.size());
      host_m_.back().zero();
      host_v_.back().zero();
      continue;
    }
    m_.emplace_back(dev, r.size());
    v_.emplace_back(dev, r.size());
    m_.back().zero();
    v_.back().zero();
  }
}

AdamW::~AdamW() {
  if (graph_.exec) dev_->graph_destroy(graph_.exec);
}

// With FT_CUDA_GRAPHS=1 (the device records graphs), as LlamaModel::train_micro_batch does for
// a micro-batch: the first step with a set of buffers runs op by op, the second is recorded as a
// graph and launched, later ones only launch, after the step's constants are uploaded, until the
// buffers change or the device's graph epoch moves. Each update reads its constants from device
// memory, so a replay gives the bits of launching the updates op by op.
void AdamW::step(const std::vector<float*>& params, const std::vector<const float*>& grads,
                 double lr, float grad_scale, const std::vector<Ref>& compute) {
  begin_step();
  auto eager = [&] {
    for (size_t g = 0; g < ranges_.size(); ++g)
      update_group(int(g), params[g], grads[g], lr, grad_scale,
                   g < compute.size() ? compute[g] : Ref());
  };
  if (on_host_ || !dev_->graphs_enabled() || graph_.failed || dev_->profile()) return eager();
  std::vector<const void*> buffers;  // what the updates read and write, besides the state
  for (size_t g = 0; g < ranges_.size(); ++g) {
    buffers.push_back(params[g]);
    buffers.push_back(grads[g]);
    buffers.push_back(g < compute.size() ? compute[g].ptr : nullptr);
  }
  StepGraph& sg = graph_;
  if (sg.exec && (sg.buffers != buffers || sg.epoch != dev_->graph_epoch())) {
    dev_->graph_destroy(sg.exec);
    sg.exec = nullptr;
  }
  kernels::AdamwArgs pair[2];
  step_args(lr, grad_scale, pair);
  device_args(pair, dev_->stream());  // before the launch (a recording may not upload)
  if (sg.exec) {
    dev_->graph_launch(sg.exec);
    return;
  }
  if (sg.warm != buffers) {
    eager();
    sg.warm = buffers;
    return;
  }
  try {
    sg.exec = dev_->graph_record(eager);
  } catch (const Error& e) {  // nothing recorded ran: this step and the later ones op by op
    sg.failed = true;
    log_warn(
        "FT_CUDA_GRAPHS: recording the optimizer step as a graph failed, so it runs op by "
        "op: ",
        e.what());
    return eager();
  }
  sg.buffers = std::move(buffers);
  sg.epoch = dev_->graph_epoch();
  ++sg.recorded;
  log_info("FT_CUDA_GRAPHS: the optimizer step recorded as a graph (recording ", sg.recorded,
           "), replayed from here on");
  dev_->graph_launch(sg.exec);
}

void AdamW::step_args(double lr, float grad_scale, kernels::AdamwArgs (&pair)[2]) const {
  for (int i = 0; i < 2; ++i)
    pair[i] = {kernels::adamw_step(float(lr), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps),
                                   i == 0 ? float(cfg_.weight_decay) : 0.0f, t_),
               grad_scale};
}

void AdamW::update_group(int group, float* params, const float* grads, double lr, float grad_scale,
                         Ref compute, Stream on) {
  const size_t gi = size_t(group);
  const ShardRange& r = ranges_[gi];
  if (r.size() == 0) return;  // nothing held, or a frozen group
  float* m = on_host_ ? host_m_[gi].data() : m_[gi].data();
  float* v = on_host_ ? host_v_[gi].data() : v_[gi].data();
  const Stream st = on_host_ ? Stream{} : on.handle ? on : dev_->stream();
  kernels::AdamwArgs pair[2];  // with and without weight decay
  step_args(lr, grad_scale, pair);
  const kernels::AdamwArgs* args = on_host_ ? pair : device_args(pair, st);
  // The range may cut through tensors: each tensor's overlap with it is updated with its own
  // weight decay, adjacent tensors with the same decay in one call (elementwise, so the bits
  // are those of one call per tensor).
  size_t run_lo = 0, run_hi = 0;
  bool run_decays = false;
  auto flush = [&] {
    if (run_lo >= run_hi) return;
    const size_t at = run_lo - r.begin;
    const Ref pc = compute.ptr ? compute + at : Ref();
    ops_.adamw_update(st, params + at, grads + at, m + at, v + at, run_hi - run_lo,
                      run_decays ? &args[0] : &args[1], pc);
    run_lo = run_hi = 0;
  };
  for (const auto& e : layout_.groups()[gi].entries) {
    const size_t lo = std::max(r.begin, e.offset), hi = std::min(r.end, e.offset + e.numel);
    if (lo >= hi) continue;
    const bool decays = e.weight_decay && cfg_.weight_decay != 0;
    if (run_lo < run_hi && (lo != run_hi || decays != run_decays)) flush();
    if (run_lo == run_hi) run_lo = lo, run_decays = decays;
    run_hi = hi;
  }
  flush();
}

const kernels::AdamwArgs* AdamW::device_args(const kernels::AdamwArgs (&args)[2], Stream st) {
  // One stream a run (the compute stream, or overlap_update's): an upload on another could
  // overtake the updates still reading the pair.
  FT_CHECK(!args_uploaded_ || st.handle == args_stream_.handle,
           "AdamW: updates queued on two streams in one run");
  if (!args_uploaded_ || std::memcmp(args_last_, args, sizeof args) != 0) {
    dev_->upload_async(st, args_.data(), args, sizeof args);
    std::memcpy(args_last_, args, sizeof args);
    args_uploaded_ = true;
    args_stream_ = st;
  }
  return args_.data();
}

size_t AdamW::state_bytes() const {
  size_t b = args_.bytes();
  for (const auto& x : m_) b += x.bytes();
  for (const auto& x : v_) b += x.bytes();
  return b;
}

}  // namespace ft
