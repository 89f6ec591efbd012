// The adapted-linear seam (model/linear.h): a hook that adds x·Pᵀ to a linear layer trains as
// that layer with the weight W + P does — the same loss, the same gradient of every tensor of
// the model, and the hook's own gradient for P equal to that weight's — at a column-parallel
// site (layer 0's q_proj), a row-parallel one (layer 1's down_proj) and the head. The hook is a
// test double (what LoRA's hooks in lib/adapt/ will be, with P = s·B·A).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "model/layout.h"
#include "model/linear.h"
#include "model/llama.h"
#include "runtime/device.h"
#include "tiny_model.h"

namespace ft {
namespace {

// Adds x·Pᵀ at its sites; dP += dyᵀ·x, dx += dy·P.
class AddMatrix final : public LinearHooks {
 public:
  struct Site {
    int in, out;
    std::vector<float> p;  // (out, in)
    Buffer<float> dev_p, grad;
  };
  explicit AddMatrix(Device* dev) : dev_(dev) {}
  void add(LinearSite at, int in, int out, uint32_t seed) {
    Site& s = sites_[key(at)];
    s.in = in;
    s.out = out;
    s.p.resize(size_t(in) * out);
    for (size_t i = 0; i < s.p.size(); ++i)  // small, fixed, of both signs
      s.p[i] = 0.05f * std::sin(float(seed + 7 * i));
    s.dev_p = Buffer<float>(dev_, s.p.size());
    s.dev_p.upload(s.p.data(), s.p.size());
    s.grad = Buffer<float>(dev_, s.p.size());
    s.grad.zero();
  }
  const Site& site(LinearSite at) const { return sites_.at(key(at)); }
  bool adapts(const LinearSite& at) const override { return sites_.count(key(at)) != 0; }
  void forward(const LinearContext&, const Linear& l, int layer, Ref y, CRef x,
               int N) const override {
    const Site& s = sites_.at(key({layer, l.proj}));
    dev_->ops().linear_forward(dev_->stream(), y, x, s.dev_p.data(), N, s.in, s.out, true);
  }
  void backward(const LinearContext&, const Linear& l, int layer, Ref dx, CRef dy, CRef x,
                int N) const override {
    const Site& s = sites_.at(key({layer, l.proj}));
    dev_->ops().linear_backward(dev_->stream(), dx, const_cast<float*>(s.grad.data()), dy, x,
                                s.dev_p.data(), N, s.in, s.out, /*accumulate_dx=*/true);
  }

 private:
  static std::pair<int, int> key(const LinearSite& s) { return {s.layer, int(s.proj)}; }
  Device* dev_;
  std::map<std::pair<int, int>, Site> sites_;
};

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

TEST_CASE("linear hooks: an added x·Pᵀ trains as the weight W + P, at column, row and head sites") {
  const ModelConfig cfg = linear_test_config();
  auto dev = make_device("cpu");
  LlamaModel hooked(cfg, dev.get()), merged(cfg, dev.get());
  hooked.init_random(7, 0.1);
  merged.init_random(7, 0.1);
  const ParamLayout& layout = hooked.layout();
  const int C = cfg.dim, F = cfg.ffn_dim, V = cfg.vocab_size, HD = cfg.n_heads * layout.head_dim();

  AddMatrix hooks(dev.get());
  struct At {
    LinearSite site;
    const char* weight;
    int in, out;
  };
  const At sites[] = {{{0, Proj::kQ}, "model.layers.0.self_attn.q_proj.weight", C, HD},
                      {{1, Proj::kDown}, "model.layers.1.mlp.down_proj.weight", F, C},
                      {{-1, Proj::kHead}, "lm_head.weight", C, V}};
  std::vector<std::vector<float>> w = merged.flat_params().to_host();
  for (const At& a : sites) {
    hooks.add(a.site, a.in, a.out, uint32_t(a.in * 31 + a.out));
    int g = 0;
    const ParamEntry* e = nullptr;
    REQUIRE(layout.find(a.weight, &g, &e));
    REQUIRE(e->numel == hooks.site(a.site).p.size());
    for (size_t i = 0; i < e->numel; ++i) w[size_t(g)][e->offset + i] += hooks.site(a.site).p[i];
  }
  merged.flat_params().from_host(w);
  hooked.set_linear_hooks(&hooks);

  const int B = 2, T = 6, N = B * T;
  std::vector<int32_t> in(N), tgt(N);
  std::vector<uint8_t> mask(N, 1);
  for (int n = 0; n < N; ++n) in[size_t(n)] = (5 * n + 3) % V, tgt[size_t(n)] = (7 * n + 1) % V;
  for (LlamaModel* m : {&hooked, &merged})
    m->forward_backward(in.data(), tgt.data(), mask.data(), B, T, 1.0f / float(N));
  const double loss_h = hooked.take_loss_sum(), loss_m = merged.take_loss_sum();
  CHECK(loss_h == doctest::Approx(loss_m).epsilon(1e-6));
  // P matters: the model without it (and without hooks) has another loss.
  LlamaModel plain(cfg, dev.get());
  plain.init_random(7, 0.1);
  plain.forward_backward(in.data(), tgt.data(), mask.data(), B, T, 1.0f / float(N));
  CHECK(std::fabs(plain.take_loss_sum() - loss_m) > 1e-4 * std::fabs(loss_m));

  // Every tensor's gradient: the same (fp32 sums in another order: ~1e-7 relative of the largest).
  auto& gh = hooked.flat_params().grads();
  auto& gm = merged.flat_params().grads();
  for (size_t g = 0; g < gh.size(); ++g) {
    std::vector<float> a(gh[g].size()), b(gm[g].size());
    gh[g].download(a.data(), a.size());
    gm[g].download(b.data(), b.size());
    const float scale = std::max(max_abs(b), 1e-12f);
    float worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / scale);
    CAPTURE(layout.groups()[g].name);
    CHECK(worst < 1e-5f);
  }
  // The hook's gradient for P is the merged weight's.
  for (const At& a : sites) {
    CAPTURE(a.weight);
    int g = 0;
    const ParamEntry* e = nullptr;
    REQUIRE(layout.find(a.weight, &g, &e));
    std::vector<float> dp(e->numel), dw(e->numel);
    hooks.site(a.site).grad.download(dp.data(), dp.size());
    std::vector<float> all(gm[size_t(g)].size());
    gm[size_t(g)].download(all.data(), all.size());
    std::copy(all.begin() + int64_t(e->offset), all.begin() + int64_t(e->offset + e->numel),
              dw.begin());
    const float scale = max_abs(dw);
    REQUIRE(scale > 0);
    float worst = 0;
    for (size_t i = 0; i < dp.size(); ++i)
      worst = std::max(worst, std::fabs(dp[i] - dw[i]) / scale);
    CHECK(worst < 1e-5f);
  }
}

}  // namespace ft
