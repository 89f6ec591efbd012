// LoRA (adapt/lora.h) against its definition: a model with an adapter (A, B at every linear
// layer of the blocks) computes the loss of the plain model whose weights are merged,
// W + s·B·A, and the adapter's gradients are the chain rule through that merge,
// dA = s·Bᵀ·dW and dB = s·dW·Aᵀ with dW the merged model's weight gradient; the base gets none.
// On the CPU in fp32; the layouts (tensor, pipeline, ZeRO) are the CLI tests'.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "adapt/lora.h"
#include "adapt/peft.h"
#include "core/dtype.h"
#include "model/layout.h"
#include "model/llama.h"
#include "runtime/device.h"
#include "tiny_model.h"
#include "train/untrained_tokens.h"

namespace ft {
namespace {

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

std::vector<float> group_of(Buffer<float>& b) {
  std::vector<float> h(b.size());
  b.download(h.data(), h.size());
  return h;
}

// The largest difference relative to the largest magnitude of `want`.
float rel_diff(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  const float scale = std::max(max_abs(want), 1e-20f);
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(got[i] - want[i]) / scale);
  return worst;
}

}  // namespace

TEST_CASE("LoRA: the adapted model is the merged one, W + s·B·A; dA and dB by the chain rule") {
  const ModelConfig cfg = linear_test_config();
  auto dev = make_device("cpu");
  AdapterConfig ac;
  ac.type = "lora";
  ac.r = 3;
  ac.alpha = 5;
  ac.target_modules = {"all-linear"};
  for (bool rslora : {false, true}) {
    CAPTURE(rslora);
    ac.use_rslora = rslora;
    ModelConverters convs;
    convs.push_back(std::make_unique<LoraConverter>(ac));
    LlamaModel lora(cfg, dev.get(), false, nullptr, {}, DType::kF32, &convs);
    LlamaModel merged(cfg, dev.get());
    lora.init_random(7, 0.1);
    merged.init_random(7, 0.1);
    for (const auto& c : convs) c->convert_model(lora, 11);
    const ParamLayout& layout = lora.layout();
    const int L = cfg.n_layers;
    REQUIRE(layout.groups().size() == size_t(2 + 2 * L));
    for (int g = 0; g < L + 2; ++g) CHECK_FALSE(layout.groups()[size_t(g)].trains());
    const float s = float(ac.scaling());
    CHECK(s == doctest::Approx(rslora ? 5 / std::sqrt(3.0) : 5 / 3.0));

    // B starts at zero (the adapted model is the base); give it values of both signs, so that
    // the term acts. A keeps its Kaiming-uniform draw: within ±1/√in, not all zero.
    std::vector<std::vector<float>> w = merged.flat_params().to_host();
    int adapted = 0;
    for (int l = 0; l < L; ++l) {
      const int ag = layout.attached_group(1 + l);
      REQUIRE(ag == L + 2 + l);
      const ParamGroup& group = layout.groups()[size_t(ag)];
      CHECK(group.trains());
      CHECK(group.name == "lora.layers." + std::to_string(l));
      std::vector<float> p = group_of(lora.flat_params().params()[size_t(ag)]);
      REQUIRE(group.entries.size() == 14);  // seven projections, A and B each
      for (size_t i = 0; i < group.entries.size(); i += 2) {
        const ParamEntry &ea = group.entries[i], &eb = group.entries[i + 1];
        const std::string base =
            ea.name.substr(std::string("base_model.model.").size(),
                           ea.name.find(".lora_A.") - std::string("base_model.model.").size());
        CAPTURE(base);
        CHECK(eb.name == "base_model.model." + base + ".lora_B.weight");
        const int r = int(ea.shape[0]), in = int(ea.shape[1]), out = int(eb.shape[0]);
        REQUIRE(r == ac.r);
        REQUIRE(eb.shape[1] == r);
        float* A = p.data() + ea.offset;
        float* B = p.data() + eb.offset;
        const float bound = 1.0f / std::sqrt(float(in));
        float amax = 0;
        for (int k = 0; k < r * in; ++k) amax = std::max(amax, std::fabs(A[k]));
        CHECK(amax <= bound);
        CHECK(amax > 0.5f * bound);
        for (int k = 0; k < out * r; ++k) {
          CHECK(B[k] == 0.0f);
          B[k] = 0.3f * std::sin(float(7 * k + 3 * i + l));
        }
        int bg = 0;
        const ParamEntry* be = nullptr;
        REQUIRE(layout.find(base + ".weight", &bg, &be));
        REQUIRE(be->shape == std::vector<int64_t>{out, in});
        for (int o = 0; o < out; ++o)
          for (int c = 0; c < in; ++c) {
            double d = 0;
            for (int k = 0; k < r; ++k) d += double(B[o * r + k]) * A[k * in + c];
            w[size_t(bg)][be->offset + size_t(o) * in + c] += float(s * d);
          }
        ++adapted;
      }
      lora.flat_params().params()[size_t(ag)].upload(p.data(), p.size());
    }
    CHECK(adapted == 7 * L);
    merged.flat_params().from_host(w);

    const int B = 2, T = 6, N = B * T, V = cfg.vocab_size;
    std::vector<int32_t> in(N), tgt(N);
    std::vector<uint8_t> mask(N, 1);
    for (int n = 0; n < N; ++n) in[size_t(n)] = (5 * n + 3) % V, tgt[size_t(n)] = (7 * n + 1) % V;
    for (LlamaModel* m : {&lora, &merged})
      m->forward_backward(in.data(), tgt.data(), mask.data(), B, T, 1.0f / float(N));
    const double loss_l = lora.take_loss_sum(), loss_m = merged.take_loss_sum();
    CHECK(loss_l == doctest::Approx(loss_m).epsilon(1e-6));
    // The adapter matters: the base alone has another loss.
    LlamaModel plain(cfg, dev.get());
    plain.init_random(7, 0.1);
    plain.forward_backward(in.data(), tgt.data(), mask.data(), B, T, 1.0f / float(N));
    CHECK(std::fabs(plain.take_loss_sum() - loss_m) > 1e-3 * std::fabs(loss_m));

    // The base has no gradient; the adapter's is the chain rule through the merge.
    for (int g = 0; g < L + 2; ++g) CHECK(lora.flat_params().grad(g) == nullptr);
    auto& gm = merged.flat_params().grads();
    for (int l = 0; l < L; ++l) {
      const int ag = layout.attached_group(1 + l);
      const ParamGroup& group = layout.groups()[size_t(ag)];
      const std::vector<float> p = group_of(lora.flat_params().params()[size_t(ag)]);
      const std::vector<float> dp = group_of(lora.flat_params().grads()[size_t(ag)]);
      for (size_t i = 0; i < group.entries.size(); i += 2) {
        const ParamEntry &ea = group.entries[i], &eb = group.entries[i + 1];
        const std::string base = ea.name.substr(17, ea.name.find(".lora_A.") - 17);
        CAPTURE(base);
        int bg = 0;
        const ParamEntry* be = nullptr;
        REQUIRE(layout.find(base + ".weight", &bg, &be));
        const std::vector<float> all = group_of(gm[size_t(bg)]);
        const float* dW = all.data() + be->offset;
        const int r = int(ea.shape[0]), in_ = int(ea.shape[1]), out = int(eb.shape[0]);
        const float* A = p.data() + ea.offset;
        const float* Bm = p.data() + eb.offset;
        std::vector<float> want_dA(size_t(r) * in_), want_dB(size_t(out) * r);
        for (int k = 0; k < r; ++k)
          for (int c = 0; c < in_; ++c) {
            double d = 0;
            for (int o = 0; o < out; ++o) d += double(Bm[o * r + k]) * dW[o * in_ + c];
            want_dA[size_t(k) * in_ + c] = float(s * d);
          }
        for (int o = 0; o < out; ++o)
          for (int k = 0; k < r; ++k) {
            double d = 0;
            for (int c = 0; c < in_; ++c) d += double(dW[o * in_ + c]) * A[k * in_ + c];
            want_dB[size_t(o) * r + k] = float(s * d);
          }
        const std::vector<float> dA(dp.begin() + int64_t(ea.offset),
                                    dp.begin() + int64_t(ea.offset + ea.numel));
        const std::vector<float> dB(dp.begin() + int64_t(eb.offset),
                                    dp.begin() + int64_t(eb.offset + eb.numel));
        CHECK(max_abs(want_dA) > 0);
        CHECK(max_abs(want_dB) > 0);
        CHECK(rel_diff(dA, want_dA) < 1e-5f);
        CHECK(rel_diff(dB, want_dB) < 1e-5f);
      }
    }
  }
}

TEST_CASE("LoRA: target modules choose the adapted projections, in layer order") {
  ModelConfig cfg = linear_test_config();
  cfg.vocab_size = 20;  // divisible by two tensor ranks
  AdapterConfig ac;
  ac.type = "lora";
  ac.r = 2;
  ac.target_modules = {"down_proj", "q_proj"};
  ModelConverters convs;
  convs.push_back(std::make_unique<LoraConverter>(ac));
  for (int tensor : {1, 2}) {
    CAPTURE(tensor);
    const ParamLayout layout = converted_layout(cfg, tensor, &convs);
    const ParamGroup& g = layout.groups()[size_t(layout.attached_group(2))];
    REQUIRE(g.entries.size() == 4);
    CHECK(g.entries[0].name == "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
    CHECK(g.entries[3].name == "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
    // q (column-parallel): A whole, B's rows split; down (row-parallel): A's columns split, B
    // whole.
    CHECK(g.entries[0].split == TensorSplit::kReplicated);
    CHECK(g.entries[1].split == TensorSplit::kRows);
    CHECK(g.entries[1].shape == std::vector<int64_t>{16 / tensor, 2});
    CHECK(g.entries[2].split == TensorSplit::kCols);
    CHECK(g.entries[2].shape == std::vector<int64_t>{2, 24 / tensor});
    CHECK(g.entries[3].split == TensorSplit::kReplicated);
    CHECK(layout.head().name == "head");
  }
}

}  // namespace ft

namespace ft {

TEST_CASE("LoRA dropout: a site's forward and backward are the definition's with the op's mask") {
  const ModelConfig cfg = linear_test_config();
  auto dev = make_device("cpu");
  AdapterConfig ac;
  ac.type = "lora";
  ac.r = 3;
  ac.alpha = 6;
  ac.dropout = 0.25;
  ac.target_modules = {"q_proj"};
  ModelConverters convs;
  convs.push_back(std::make_unique<LoraConverter>(ac));
  LlamaModel model(cfg, dev.get(), false, nullptr, {}, DType::kF32, &convs);
  model.init_random(7, 0.1);
  convs.front()->convert_model(model, 11);
  const ParamLayout& layout = model.layout();
  const int ag = layout.attached_group(1);
  const ParamGroup& group = layout.groups()[size_t(ag)];
  const int C = cfg.dim, HD = cfg.n_heads * layout.head_dim(), r = ac.r, N = 10;
  std::vector<float> p = group_of(model.flat_params().params()[size_t(ag)]);
  const size_t a_at = group.entries[0].offset, b_at = group.entries[1].offset;
  for (int k = 0; k < HD * r; ++k) p[b_at + size_t(k)] = 0.4f * std::cos(float(5 * k + 1));
  model.flat_params().params()[size_t(ag)].upload(p.data(), p.size());
  const float* A = p.data() + a_at;
  const float* Bm = p.data() + b_at;

  std::vector<float> x(size_t(N) * C), dy(size_t(N) * HD);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(3 * i + 2));
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = 0.5f * std::cos(float(7 * i + 4));
  // The mask scaled by 1 / (1 − p), drawn by the op on ones under the site's key.
  const uint64_t first = 7;  // the run-wide index of the first sample; N = 2 samples of 5 rows
  std::vector<float> md(x.size(), 1.0f);
  Buffer<float> ones(dev.get(), md.size());
  ones.upload(md.data(), md.size());
  // The keys the model stages for the micro-batch (LinearHooks::dropout_keys); the site's are
  // lora_dropout_key's for its samples.
  std::vector<uint64_t> keys(model.linear_hooks()->dropout_key_count(2, cfg.n_layers));
  REQUIRE(!keys.empty());
  model.linear_hooks()->dropout_keys(first, 2, cfg.n_layers, keys.data());
  Buffer<uint64_t> keys_d(dev.get(), keys.size());
  keys_d.upload(keys.data(), keys.size());
  for (int b = 0; b < 2; ++b) {
    const uint64_t key = lora_dropout_key(11, first + uint64_t(b), 0, Proj::kQ);
    REQUIRE(std::find(keys.begin(), keys.end(), key) != keys.end());
    dev->ops().dropout_scale(dev->stream(), ones.data() + size_t(b) * 5 * C,
                             ones.data() + size_t(b) * 5 * C, 5, size_t(C), 0, float(ac.dropout),
                             1.0f, &key);
  }
  ones.download(md.data(), md.size());
  int dropped = 0;
  for (float v : md) dropped += v == 0.0f;
  CHECK(dropped > 0);
  CHECK(dropped < N * C / 2);

  const float s = float(ac.scaling());
  for (bool training : {true, false}) {
    CAPTURE(training);
    Buffer<float> xb(dev.get(), x.size()), dyb(dev.get(), dy.size());
    Buffer<float> y(dev.get(), dy.size()), dx(dev.get(), x.size());
    xb.upload(x.data(), x.size());
    dyb.upload(dy.data(), dy.size());
    y.zero();
    dx.zero();
    model.flat_params().zero_grads();
    const TensorGroup one(nullptr, dev.get());
    LinearContext c;
    c.dev = dev.get();
    c.tp = &one;
    c.hooks = model.linear_hooks();
    c.adapter = model.flat_params().compute_params(ag);
    c.adapter_grad = model.flat_params().grads()[size_t(ag)].data();
    c.training = training;
    c.first_sample = first;
    c.seq_len = 5;
    c.dropout_keys = keys_d.data();
    c.dropout_samples = 2;
    const Linear q{Proj::kQ, C, HD};
    REQUIRE(c.hooks->adapts({0, Proj::kQ}));
    CHECK_FALSE(c.hooks->adapts({0, Proj::kK}));
    c.hooks->forward(c, q, 0, y.data(), xb.data(), N);
    if (training) c.hooks->backward(c, q, 0, dx.data(), dyb.data(), xb.data(), N);

    // The definition, in double: xd = x ∘ md; t = s·xd·Aᵀ; y = t·Bᵀ; dB = dyᵀ·t; dt = s·dy·B;
    // dA = dtᵀ·xd; dx = (dt·A) ∘ md.
    std::vector<double> xd(x.size()), t(size_t(N) * r), dt(size_t(N) * r);
    for (size_t i = 0; i < x.size(); ++i) xd[i] = double(x[i]) * (training ? md[i] : 1.0f);
    std::vector<float> want_y(dy.size()), want_dA(size_t(r) * C), want_dB(size_t(HD) * r),
        want_dx(x.size());
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < r; ++k) {
        double a = 0, d = 0;
        for (int i = 0; i < C; ++i) a += xd[size_t(n) * C + i] * A[k * C + i];
        for (int o = 0; o < HD; ++o) d += double(dy[size_t(n) * HD + o]) * Bm[o * r + k];
        t[size_t(n) * r + k] = s * a;
        dt[size_t(n) * r + k] = s * d;
      }
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < HD; ++o) {
        double v = 0;
        for (int k = 0; k < r; ++k) v += t[size_t(n) * r + k] * Bm[o * r + k];
        want_y[size_t(n) * HD + o] = float(v);
      }
    for (int o = 0; o < HD; ++o)
      for (int k = 0; k < r; ++k) {
        double v = 0;
        for (int n = 0; n < N; ++n) v += double(dy[size_t(n) * HD + o]) * t[size_t(n) * r + k];
        want_dB[size_t(o) * r + k] = float(v);
      }
    for (int k = 0; k < r; ++k)
      for (int i = 0; i < C; ++i) {
        double v = 0;
        for (int n = 0; n < N; ++n) v += dt[size_t(n) * r + k] * xd[size_t(n) * C + i];
        want_dA[size_t(k) * C + i] = float(v);
      }
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < C; ++i) {
        double v = 0;
        for (int k = 0; k < r; ++k) v += dt[size_t(n) * r + k] * A[k * C + i];
        want_dx[size_t(n) * C + i] = float(v * md[size_t(n) * C + i]);
      }
    std::vector<float> got_y(dy.size());
    y.download(got_y.data(), got_y.size());
    CHECK(rel_diff(got_y, want_y) < 1e-5f);
    if (!training) continue;  // evaluation: no dropout, and no backward
    std::vector<float> got_dx(x.size());
    dx.download(got_dx.data(), got_dx.size());
    const std::vector<float> g = group_of(model.flat_params().grads()[size_t(ag)]);
    const std::vector<float> got_dA(g.begin() + int64_t(a_at), g.begin() + int64_t(a_at) + r * C);
    const std::vector<float> got_dB(g.begin() + int64_t(b_at), g.begin() + int64_t(b_at) + HD * r);
    CHECK(rel_diff(got_dx, want_dx) < 1e-5f);
    CHECK(rel_diff(got_dA, want_dA) < 1e-5f);
    CHECK(rel_diff(got_dB, want_dB) < 1e-5f);
  }
}

}  // namespace ft

namespace ft {

// QLoRA (adapter.type qlora): the blocks' matrices are held in NF4 (FlatParams::quantized), and
// the model computes with them dequantized: its loss and adapter gradients are LoRA's on a base
// whose weights are the dequantized ones (to_host), within 1e-5 in fp32 — the same computation,
// so in practice the same bits. In bf16 the dequantized values are bf16 (rounded once). The
// quantized blocks hold no fp32 or compute-dtype copy: their bytes are NF4's.
TEST_CASE("QLoRA: LoRA's loss and gradients on the dequantized base; NF4 bytes only") {
  auto dev = make_device("cpu");
  ModelConfig cfg = linear_test_config();
  cfg.ffn_dim = 40;  // down_proj (16, 40): 640 elements, blocks of 64 in rows of 40
  AdapterConfig ac;
  ac.type = "qlora";
  ac.r = 2;
  ac.alpha = 4;
  ac.target_modules = {"all-linear"};
  AdapterConfig lc = ac;
  lc.type = "lora";
  const int L = cfg.n_layers, B = 2, T = 6, N = B * T, V = cfg.vocab_size;
  std::vector<int32_t> in(N), tgt(N);
  std::vector<uint8_t> mask(N, 1);
  for (int n = 0; n < N; ++n) in[size_t(n)] = (5 * n + 3) % V, tgt[size_t(n)] = (7 * n + 1) % V;

  ModelConverters qc, lcv;
  qc.push_back(std::make_unique<LoraConverter>(ac));
  lcv.push_back(std::make_unique<LoraConverter>(lc));
  LlamaModel q(cfg, dev.get(), false, nullptr, {}, DType::kF32, &qc);
  LlamaModel l(cfg, dev.get(), false, nullptr, {}, DType::kF32, &lcv);
  q.init_random(7, 0.1);
  qc.front()->convert_model(q, 11);
  const ParamLayout& layout = q.layout();
  for (int b = 0; b < L; ++b) {
    CHECK(q.flat_params().quantized(1 + b));
    CHECK(q.flat_params().params()[size_t(1 + b)].size() == 0);
  }
  CHECK_FALSE(q.flat_params().quantized(0));
  CHECK_FALSE(q.flat_params().quantized(L + 1));
  // The dequantized base is close to the drawn one, not equal (4 bits an element).
  LlamaModel drawn(cfg, dev.get());
  drawn.init_random(7, 0.1);
  std::vector<std::vector<float>> w = q.flat_params().to_host();
  const std::vector<std::vector<float>> w0 = drawn.flat_params().to_host();
  for (int b = 0; b < L; ++b) {
    const float d = rel_diff(w[size_t(1 + b)], w0[size_t(1 + b)]);
    CHECK(d > 0);
    CHECK(d < 0.2f);
  }
  CHECK(w[0] == w0[0]);  // the embedding is not quantized
  // The same adapter, B ≠ 0, on LoRA with the dequantized base.
  for (int b = 0; b < L; ++b) {
    const int ag = layout.attached_group(1 + b);
    std::vector<float> p = group_of(q.flat_params().params()[size_t(ag)]);
    for (size_t i = 0; i < p.size(); ++i) p[i] += 0.2f * std::sin(float(3 * i + b));
    w[size_t(ag)] = p;
  }
  // The blocks are quantized again from their dequantized values (the double quantization's
  // mean moves, so not to the same bits): the LoRA model takes what q holds now.
  q.flat_params().from_host(w);
  const std::vector<std::vector<float>> wq = q.flat_params().to_host();
  l.flat_params().from_host(wq);
  lcv.front()->convert_model(l, 11);  // the hooks (A and B set again below)
  for (int b = 0; b < L; ++b) {
    const int ag = layout.attached_group(1 + b);
    CHECK(wq[size_t(ag)] == w[size_t(ag)]);
    l.flat_params().params()[size_t(ag)].upload(w[size_t(ag)].data(), w[size_t(ag)].size());
  }
  for (LlamaModel* m : {&q, &l})
    m->forward_backward(in.data(), tgt.data(), mask.data(), B, T, 1.0f / float(N));
  const double lq = q.take_loss_sum(), ll = l.take_loss_sum();
  CHECK(lq == doctest::Approx(ll).epsilon(1e-5));
  for (int b = 0; b < L; ++b) {
    const int ag = layout.attached_group(1 + b);
    const std::vector<float> gq = group_of(q.flat_params().grads()[size_t(ag)]);
    const std::vector<float> gl = group_of(l.flat_params().grads()[size_t(ag)]);
    CHECK(max_abs(gl) > 0);
    CHECK(rel_diff(gq, gl) < 1e-5f);
  }
  // Bytes: a block's matrices at 4 bits, an 8-bit absmax per 64 elements and an fp32 scale per
  // 256 of those, its norms in fp32, and one dequantized block for all, where LoRA holds every
  // block in fp32.
  size_t want = l.flat_params().param_bytes(), most = 0;
  for (int b = 0; b < L; ++b) {
    const ParamGroup& g = layout.groups()[size_t(1 + b)];
    want -= 4 * g.numel;
    most = std::max(most, g.numel);
    for (const ParamEntry& e : g.entries) {
      const size_t nb = (e.numel + 63) / 64;
      want += e.nf4 ? (e.numel + 1) / 2 + nb + 4 * ((nb + 255) / 256) : 4 * e.numel;
      CHECK(e.nf4 == (e.shape.size() == 2));
    }
  }
  CHECK(q.flat_params().param_bytes() == want + 4 * most);
  // The blocks share one dequantized buffer: a second block acquired while one is held is
  // refused; the same block again (a recomputation inside its backward) is not.
  FlatParams& fq = q.flat_params();
  const CRef b0 = fq.acquire(1);
  CHECK(fq.acquire(1).ptr == b0.ptr);
  CHECK_THROWS(fq.acquire(2));
  fq.release(1);
  CHECK_THROWS(fq.acquire(2));  // still held once
  fq.release(1);
  fq.acquire(2);
  fq.release(2);

  // bf16: the dequantized values are bf16; the base keeps them through training steps.
  ModelConverters qb;
  qb.push_back(std::make_unique<LoraConverter>(ac));
  LlamaModel h(cfg, dev.get(), false, nullptr, {}, DType::kBF16, &qb);
  h.init_random(7, 0.1);
  qb.front()->convert_model(h, 11);
  const std::vector<std::vector<float>> wh = h.flat_params().to_host();
  for (int b = 0; b < L; ++b)
    for (float x : wh[size_t(1 + b)]) REQUIRE(bf16_to_f32(f32_to_bf16(x)) == x);
}

}  // namespace ft

namespace ft {

// modules_to_save (issue 28 point 4): what trains, where the head's tensors go, and that a model
// training lm_head apart from its norm computes what the plain model computes (B = 0: the
// adapted model is the base) with lm_head's gradient the plain model's.
TEST_CASE("LoRA modules_to_save: the groups that train; lm_head apart from the final norm") {
  AdapterConfig ac;
  ac.type = "lora";
  ac.r = 2;
  auto layout_with = [&](std::vector<std::string> modules, bool tied, int tensor) {
    ModelConfig cfg = linear_test_config();
    cfg.vocab_size = 20;  // divisible by two tensor ranks
    cfg.tie_embeddings = tied;
    AdapterConfig a = ac;
    a.modules_to_save = std::move(modules);
    ModelConverters convs;
    convs.push_back(std::make_unique<LoraConverter>(a));
    return converted_layout(cfg, tensor, &convs);
  };
  const int L = linear_test_config().n_layers, C = linear_test_config().dim;
  auto trains = [](const ParamLayout& l) {
    std::vector<int> g;
    for (size_t i = 0; i < l.groups().size(); ++i)
      if (l.groups()[i].trains() && l.groups()[i].attached_to < 0) g.push_back(int(i));
    return g;
  };
  for (int tensor : {1, 2}) {
    CAPTURE(tensor);
    // lm_head alone: the final norm leaves the head group for a frozen group of its own, after
    // the model's and before the adapter's.
    const ParamLayout head = layout_with({"lm_head"}, false, tensor);
    CHECK(trains(head) == std::vector<int>{L + 1});
    REQUIRE(head.groups()[size_t(L + 1)].entries.size() == 1);
    CHECK(head.groups()[size_t(L + 1)].entries[0].name == "lm_head.weight");
    CHECK(head.groups()[size_t(L + 1)].entries[0].offset == 0);
    CHECK(head.groups()[size_t(L + 2)].name == "norm");
    CHECK(head.groups()[size_t(L + 2)].entries[0].name == "model.norm.weight");
    CHECK(!head.groups()[size_t(L + 2)].trains());
    CHECK(head.groups()[size_t(L + 2)].attached_to == -1);
    CHECK(head.attached_group(1) == L + 3);
    CHECK(head.final_norm().group == L + 2);
    CHECK(head.final_norm().offset == 0);
    CHECK(head.output_weight().group == L + 1);
    CHECK(head.output_weight().offset == 0);
    // The embedding alone: group 0; the head as it was, frozen.
    const ParamLayout embed = layout_with({"embed_tokens"}, false, tensor);
    CHECK(trains(embed) == std::vector<int>{0});
    CHECK(embed.groups().size() == size_t(L + 2 + L));
    CHECK(embed.output_weight().group == L + 1);
    CHECK(embed.output_weight().offset == size_t(C));
    // Tied: either name is the one table (group 0); the head group keeps the norm, frozen.
    for (const char* m : {"lm_head", "embed_tokens"}) {
      const ParamLayout tied = layout_with({m}, true, tensor);
      CHECK(trains(tied) == std::vector<int>{0});
      CHECK(tied.groups().size() == size_t(L + 2 + L));
      CHECK(tied.output_weight().group == 0);
      CHECK(tied.final_norm().group == L + 1);
    }
    CHECK(trains(layout_with({}, false, tensor)).empty());
  }

  auto dev = make_device("cpu");
  ModelConfig cfg = linear_test_config();
  const int B = 2, T = 5, N = B * T, V = cfg.vocab_size;
  std::vector<int32_t> in(N), tgt(N);
  std::vector<uint8_t> mask(N, 1);
  for (int n = 0; n < N; ++n) in[size_t(n)] = (5 * n + 3) % V, tgt[size_t(n)] = (7 * n + 1) % V;
  LlamaModel plain(cfg, dev.get(), false, nullptr, {}, DType::kF32);
  plain.init_random(7, 0.1);
  plain.forward_backward(in.data(), tgt.data(), mask.data(), B, T, 1.0f / float(N));
  const double plain_loss = plain.take_loss_sum();
  const std::vector<float> plain_head = group_of(plain.flat_params().grads()[size_t(L + 1)]);
  AdapterConfig a = ac;
  a.modules_to_save = {"lm_head"};
  ModelConverters convs;
  convs.push_back(std::make_unique<LoraConverter>(a));
  LlamaModel m(cfg, dev.get(), false, nullptr, {}, DType::kF32, &convs);
  m.init_random(7, 0.1);  // the same base: drawn by tensor name
  convs.front()->convert_model(m, 11);
  m.forward_backward(in.data(), tgt.data(), mask.data(), B, T, 1.0f / float(N));
  CHECK(m.take_loss_sum() == doctest::Approx(plain_loss).epsilon(1e-6));
  const std::vector<float> head_grad = group_of(m.flat_params().grads()[size_t(L + 1)]);
  const std::vector<float> want(plain_head.begin() + C, plain_head.end());  // past the norm's
  CHECK(max_abs(head_grad) > 0);
  CHECK(rel_diff(head_grad, want) < 1e-6f);
  CHECK(m.flat_params().grads()[size_t(L + 2)].size() == 0);  // the norm: frozen, no gradient
  CHECK(m.flat_params().grads()[0].size() == 0);
}

}  // namespace ft

namespace ft {

TEST_CASE("PEFT's modules_to_save as ft reads it; an untrained-looking row") {
  using nlohmann::json;
  // Names or module paths, each once; what else PEFT lists is not ft's to train.
  CHECK(peft_modules_to_save(json()) == std::vector<std::string>{});
  CHECK(peft_modules_to_save(json::parse(R"(["lm_head", "model.embed_tokens", "embed_tokens"])")) ==
        std::vector<std::string>{"lm_head", "embed_tokens"});
  CHECK(!peft_modules_to_save(json::parse(R"(["score"])")));
  CHECK(!peft_modules_to_save(json::parse(R"("lm_head")")));
  // Tied, every list names the one table.
  CHECK(same_modules_to_save({"lm_head"}, {"embed_tokens"}, true));
  CHECK(!same_modules_to_save({"lm_head"}, {"embed_tokens"}, false));
  CHECK(same_modules_to_save({"lm_head", "embed_tokens"}, {"embed_tokens", "lm_head"}, false));
  CHECK(!same_modules_to_save({}, {"lm_head"}, true));
  const json untied = json::parse(R"({"modules_to_save": ["lm_head"]})");
  CHECK(peft_tying_problem(untied, false).empty());
  CHECK(!peft_tying_problem(untied, true).empty());
  CHECK(peft_tying_problem(json::parse(R"({"modules_to_save": ["lm_head"],
                                            "ensure_weight_tying": true})"),
                           true)
            .empty());
  CHECK(peft_saved_name("lm_head.weight") == "base_model.model.lm_head.weight");

  // The median of row norms: rows (3, 4) = 5, (0, 0) = 0, (6, 8) = 10, (1, 0) = 1.
  const std::vector<float> rows = {3, 4, 0, 0, 6, 8, 1, 0};
  CHECK(median_row_norm(rows.data(), 4, 2) == doctest::Approx(3.0));  // (1 + 5) / 2
  CHECK(median_row_norm(rows.data(), 3, 2) == doctest::Approx(5.0));
  CHECK(median_row_norm(rows.data(), 0, 2) == 0.0);
  // The zero row is far below a tenth of the median; the unit one is not below 0.1 · 3.
  CHECK(median_row_norm(rows.data() + 2, 1, 2) < kUntrainedNormRatio * 3.0);
  CHECK(!(median_row_norm(rows.data() + 6, 1, 2) < kUntrainedNormRatio * 3.0));
}

}  // namespace ft
