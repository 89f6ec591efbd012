#include "optim/adamw.h"

#include "kernels/kernels.h"

namespace ft {

AdamW::AdamW(const ParamLayout& layout, const OptimizerConfig& cfg, Device* dev)
    : layout_(layout), cfg_(cfg) {
  for (const auto& g : layout.groups()) {
    m_.emplace_back(dev, g.numel);
    v_.emplace_back(dev, g.numel);
    m_.back().zero();
    v_.back().zero();
  }
}

void AdamW::step(std::vector<Buffer<float>>& params, const std::vector<Buffer<float>>& grads,
                 double lr) {
  ++t_;
  const auto& groups = layout_.groups();
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (const auto& e : groups[gi].entries) {
      const float wd = e.weight_decay ? float(cfg_.weight_decay) : 0.0f;
      kernels::adamw_update(params[gi].data() + e.offset, grads[gi].data() + e.offset,
                            m_[gi].data() + e.offset, v_[gi].data() + e.offset, e.numel, float(lr),
                            float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps), wd, t_);
    }
}

size_t AdamW::state_bytes() const {
  size_t b = 0;
  for (const auto& x : m_) b += x.bytes();
  for (const auto& x : v_) b += x.bytes();
  return b;
}

double grad_sum_squares(const std::vector<Buffer<float>>& grads) {
  double s = 0.0;
  for (const auto& g : grads) s += kernels::sum_squares(g.data(), g.size());
  return s;
}

double clip_grads(std::vector<Buffer<float>>& grads, double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return 1.0;
  for (auto& g : grads) kernels::scale_inplace(g.data(), float(coef), g.size());
  return coef;
}

}  // namespace ft
