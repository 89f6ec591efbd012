#include "optim/adamw.h"

#include <algorithm>

#include "core/error.h"

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

void AdamW::step(const std::vector<float*>& params, const std::vector<const float*>& grads,
                 double lr, float grad_scale, const std::vector<Ref>& compute) {
  begin_step();
  for (size_t g = 0; g < ranges_.size(); ++g)
    update_group(int(g), params[g], grads[g], lr, grad_scale,
                 g < compute.size() ? compute[g] : Ref());
}

void AdamW::update_group(int group, float* params, const float* grads, double lr, float grad_scale,
                         Ref compute, Stream on) {
  const size_t gi = size_t(group);
  const ShardRange& r = ranges_[gi];
  if (r.size() == 0) return;  // nothing held, or a frozen group
  float* m = on_host_ ? host_m_[gi].data() : m_[gi].data();
  float* v = on_host_ ? host_v_[gi].data() : v_[gi].data();
  const Stream st = on_host_ ? Stream{} : on.handle ? on : dev_->stream();
  // The range may cut through tensors: each tensor's overlap with it is updated with its own
  // weight decay, adjacent tensors with the same decay in one call (elementwise, so the bits
  // are those of one call per tensor).
  size_t run_lo = 0, run_hi = 0;
  float run_wd = 0.0f;
  auto flush = [&] {
    if (run_lo >= run_hi) return;
    const size_t at = run_lo - r.begin;
    const Ref pc = compute.ptr ? compute + at : Ref();
    ops_.adamw_update(st, params + at, grads + at, m + at, v + at, run_hi - run_lo, float(lr),
                      float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps), run_wd, t_, grad_scale,
                      pc);
    run_lo = run_hi = 0;
  };
  for (const auto& e : layout_.groups()[gi].entries) {
    const size_t lo = std::max(r.begin, e.offset), hi = std::min(r.end, e.offset + e.numel);
    if (lo >= hi) continue;
    const float wd = e.weight_decay ? float(cfg_.weight_decay) : 0.0f;
    if (run_lo < run_hi && (lo != run_hi || wd != run_wd)) flush();
    if (run_lo == run_hi) run_lo = lo, run_wd = wd;
    run_hi = hi;
  }
  flush();
}

size_t AdamW::state_bytes() const {
  size_t b = 0;
  for (const auto& x : m_) b += x.bytes();
  for (const auto& x : v_) b += x.bytes();
  return b;
}

}  // namespace ft
