// CPU kernels against plain loops and against finite differences, at awkward sizes
// (1, odd, non-power-of-two head dims, GQA ratios).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "random_values.h"
#include "runtime/cpu_ops.h"

namespace k = ft::kernels;

namespace {
using ft::unit_test::randn;

// Central finite difference of f at x[i] (f evaluated in float; step chosen for f32 noise).
double fd(std::vector<float>& x, size_t i, const std::function<double()>& f, float h = 1e-2f) {
  float saved = x[i];
  x[i] = saved + h;
  double fp = f();
  x[i] = saved - h;
  double fm = f();
  x[i] = saved;
  return (fp - fm) / (2.0 * h);
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}
}  // namespace

TEST_CASE("attention forward matches a plain loop; backward matches finite differences") {
  // (B, T, H, K, D): GQA 3:1 with odd D, MHA, a single token, a single head.
  const int shapes[][5] = {{2, 5, 3, 1, 7}, {1, 9, 2, 2, 4}, {2, 1, 4, 2, 6}, {1, 4, 1, 1, 3}};
  for (const auto& s : shapes) {
    const int B = s[0], T = s[1], H = s[2], K = s[3], D = s[4];
    CAPTURE(B);
    CAPTURE(T);
    CAPTURE(H);
    CAPTURE(K);
    CAPTURE(D);
    auto q = randn(size_t(B) * T * H * D, 1), kk = randn(size_t(B) * T * K * D, 2),
         v = randn(size_t(B) * T * K * D, 3), R = randn(size_t(B) * T * H * D, 4);
    std::vector<float> out(q.size()), lse(size_t(B) * H * T);
    k::attention_forward(out.data(), lse.data(), q.data(), kk.data(), v.data(), B, T, H, K, D);
    // plain loop
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < T; ++i) {
          int kh = h / (H / K);
          std::vector<double> sc(i + 1);
          double mx = -1e30;
          for (int j = 0; j <= i; ++j) {
            double d = 0;
            for (int e = 0; e < D; ++e)
              d += double(q[((b * T + i) * H + h) * D + e]) * kk[((b * T + j) * K + kh) * D + e];
            sc[j] = d / std::sqrt(double(D));
            mx = std::max(mx, sc[j]);
          }
          double z = 0;
          for (auto& x : sc) {
            x = std::exp(x - mx);
            z += x;
          }
          for (int e = 0; e < D; ++e) {
            double o = 0;
            for (int j = 0; j <= i; ++j) o += sc[j] / z * v[((b * T + j) * K + kh) * D + e];
            CHECK(out[((b * T + i) * H + h) * D + e] == doctest::Approx(o).epsilon(1e-5));
          }
        }
    // backward of L = Σ out ∘ R
    std::vector<float> dq(q.size()), dk(kk.size()), dv(v.size());
    std::vector<float> scratch(k::attention_backward_scratch_elems<float>(B, T, H, D));
    k::attention_backward(dq.data(), dk.data(), dv.data(), R.data(), out.data(), lse.data(),
                          q.data(), kk.data(), v.data(), scratch.data(), B, T, H, K, D);
    auto loss = [&]() {
      std::vector<float> o(q.size()), l(lse.size());
      k::attention_forward(o.data(), l.data(), q.data(), kk.data(), v.data(), B, T, H, K, D);
      return dot(o, R);
    };
    for (size_t i = 0; i < q.size(); i += 3)
      CHECK(dq[i] == doctest::Approx(fd(q, i, loss)).epsilon(2e-2).scale(1));
    for (size_t i = 0; i < kk.size(); i += 2)
      CHECK(dk[i] == doctest::Approx(fd(kk, i, loss)).epsilon(2e-2).scale(1));
    for (size_t i = 0; i < v.size(); i += 2)
      CHECK(dv[i] == doctest::Approx(fd(v, i, loss)).epsilon(2e-2).scale(1));
  }
}

TEST_CASE("rmsnorm backward matches finite differences and accumulates dw") {
  const int N = 3, C = 19;
  auto x = randn(N * C, 5), w = randn(C, 6), R = randn(N * C, 7);
  std::vector<float> y(N * C), rstd(N), dx(N * C), dw(C, 0.5f);
  k::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  k::rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  auto loss = [&]() {
    std::vector<float> o(N * C), r(N);
    k::rmsnorm_forward(o.data(), r.data(), x.data(), w.data(), N, C, 1e-5f);
    return dot(o, R);
  };
  for (size_t i = 0; i < x.size(); ++i)
    CHECK(dx[i] == doctest::Approx(fd(x, i, loss)).epsilon(2e-2).scale(1));
  for (size_t i = 0; i < w.size(); ++i)
    CHECK(dw[i] - 0.5f == doctest::Approx(fd(w, i, loss)).epsilon(2e-2).scale(1));
}

TEST_CASE("rmsnorm backward with accumulate_dx: the plain dx added by add_inplace, bit for bit") {
  // The fused residual add (lib/model/llama.cpp) must not move fp32 bits: old + dx in fp32 is
  // one rounding either way. Odd widths and a vector-sized one; 1, 19 and 111 rows.
  for (int C : {1, 19, 111, 1000})
    for (int N : {1, 19, 111}) {
      INFO("N " << N << " C " << C);
      const size_t NC = size_t(N) * C;
      auto x = randn(NC, 20, 3.f), w = randn(size_t(C), 21), dy = randn(NC, 22);
      const auto dx0 = randn(NC, 23);  // the residual gradient the norm's branch adds into
      std::vector<float> y(NC), rstd(N), dx(NC), dw(C, 0.5f), dw_acc = dw;
      k::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
      k::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
      auto want = dx0;
      k::add_inplace(want.data(), dx.data(), NC);

      auto got = dx0;
      k::rmsnorm_backward(got.data(), dw_acc.data(), dy.data(), x.data(), w.data(), rstd.data(), N,
                          C, /*accumulate_dx=*/true);
      CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * NC) == 0);
      CHECK(std::memcmp(dw_acc.data(), dw.data(), sizeof(float) * C) == 0);  // dw as before
    }
}

TEST_CASE("rmsnorm backward through the ops: a dx overlapping dout or x is refused") {
  // The kernel reads dout and x again (for dw) after writing dx, so an overlap would give wrong
  // gradients silently; accumulating into the residual gradient makes such a mix-up easier.
  const int N = 3, C = 5;
  auto ops = ft::make_cpu_ops();
  std::vector<float> buf(4 * N * C, 0.25f), w(C, 1.f), rstd(N, 1.f), dw(C);
  float* x = buf.data();
  float* dout = buf.data() + N * C;
  float* dx = buf.data() + 2 * N * C;
  for (bool acc : {false, true}) {
    CHECK_NOTHROW(
        ops->rmsnorm_backward({}, dx, dw.data(), dout, x, w.data(), rstd.data(), N, C, acc));
    CHECK_THROWS_WITH(
        ops->rmsnorm_backward({}, dout + 1, dw.data(), dout, x, w.data(), rstd.data(), N, C, acc),
        doctest::Contains("dx overlaps dout or x"));
    CHECK_THROWS_WITH(
        ops->rmsnorm_backward({}, x, dw.data(), dout, x, w.data(), rstd.data(), N, C, acc),
        doctest::Contains("dx overlaps dout or x"));
    // x ending where dx begins: adjacent, no overlap.
    CHECK_NOTHROW(ops->rmsnorm_backward({}, buf.data() + 3 * N * C, dw.data(), dout, dx, w.data(),
                                        rstd.data(), N, C, acc));
  }
}

TEST_CASE("rope: backward is the inverse rotation; positions start at 0") {
  const int B = 2, T = 5, nh = 3, D = 10;
  auto x = randn(size_t(B) * T * nh * D, 8), y = x;
  std::vector<float> inv_freq(D / 2);
  for (int i = 0; i < D / 2; ++i) inv_freq[i] = 1.0f / std::pow(10000.f, float(2 * i) / D);
  k::rope_forward(y.data(), inv_freq.data(), B, T, nh, D);
  for (int i = 0; i < nh * D; ++i) CHECK(y[i] == x[i]);  // t = 0 is the identity
  // t = 1, head 0, pair 1: turned by exactly inv_freq[1] radians.
  const float* x1 = x.data() + nh * D;
  const float c = std::cos(inv_freq[1]), s = std::sin(inv_freq[1]);
  CHECK(y[nh * D + 1] == doctest::Approx(x1[1] * c - x1[1 + D / 2] * s).epsilon(1e-6));
  CHECK(y[nh * D + 1 + D / 2] == doctest::Approx(x1[1 + D / 2] * c + x1[1] * s).epsilon(1e-6));
  k::rope_backward(y.data(), inv_freq.data(), B, T, nh, D);
  for (size_t i = 0; i < x.size(); ++i) CHECK(y[i] == doctest::Approx(x[i]).epsilon(1e-5));
}

TEST_CASE("decode kernels: RoPE at the cache's positions and attention_decode equal training's") {
  // One sequence of T tokens, GQA 2:1, odd head count; the last Tq tokens are "new" at pos.
  const int T = 11, H = 4, K = 2, D = 8, Tq = 3, pos = T - Tq;
  std::vector<float> inv_freq(D / 2), other(D / 2);
  for (int i = 0; i < D / 2; ++i) inv_freq[i] = 1.0f / std::pow(10000.f, float(2 * i) / D);
  for (int i = 0; i < D / 2; ++i) other[i] = 2 * inv_freq[i];
  std::vector<int32_t> positions(T);  // as lib/model/decode.cpp: rows pos.. use positions + pos
  std::iota(positions.begin(), positions.end(), 0);
  auto q = randn(size_t(T) * H * D, 21), kk = randn(size_t(T) * K * D, 22);
  const auto v = randn(size_t(T) * K * D, 23);
  // rope_forward at positions pos.. on those rows alone gives the whole sequence's bits there.
  auto q_new = std::vector<float>(q.begin() + size_t(pos) * H * D, q.end());
  auto k_new = std::vector<float>(kk.begin() + size_t(pos) * K * D, kk.end());
  auto k_steps = kk;
  k::rope_forward(q.data(), inv_freq.data(), 1, T, H, D);
  k::rope_forward(kk.data(), inv_freq.data(), 1, T, K, D);
  k::rope_forward(q_new.data(), inv_freq.data(), 1, Tq, H, D, positions.data() + pos);
  k::rope_forward(k_new.data(), inv_freq.data(), 1, Tq, K, D, positions.data() + pos);
  for (size_t i = 0; i < q_new.size(); ++i) CHECK(q_new[i] == q[size_t(pos) * H * D + i]);
  for (size_t i = 0; i < k_new.size(); ++i) CHECK(k_new[i] == kk[size_t(pos) * K * D + i]);
  // One row per call, as generated tokens come: the CPU's cos/sin tables (emptied by the call
  // with other frequencies) then grow by a row per call; the bits stay the whole sequence's.
  std::vector<float> scratch(size_t(K) * D);
  k::rope_forward(scratch.data(), other.data(), 1, 1, K, D);
  for (int t = 0; t < T; ++t)
    k::rope_forward(k_steps.data() + size_t(t) * K * D, inv_freq.data(), 1, 1, K, D,
                    positions.data() + t);
  for (size_t i = 0; i < kk.size(); ++i) CHECK(k_steps[i] == kk[i]);
  std::vector<float> out(size_t(T) * H * D), lse(size_t(H) * T), dec(size_t(T) * H * D);
  k::attention_forward(out.data(), lse.data(), q.data(), kk.data(), v.data(), 1, T, H, K, D);
  // The whole sequence as one prefill, then the last Tq queries against the cache.
  k::attention_decode(dec.data(), q.data(), kk.data(), v.data(), 0, T, H, K, D);
  for (size_t i = 0; i < out.size(); ++i) CHECK(dec[i] == doctest::Approx(out[i]).epsilon(1e-5));
  k::attention_decode(dec.data(), q.data() + size_t(pos) * H * D, kk.data(), v.data(), pos, Tq, H,
                      K, D);
  for (size_t i = 0; i < size_t(Tq) * H * D; ++i)
    CHECK(dec[i] == doctest::Approx(out[size_t(pos) * H * D + i]).epsilon(1e-5));
}

TEST_CASE("swiglu and cross-entropy gradients match finite differences") {
  const size_t n = 13;
  auto g = randn(n, 9), u = randn(n, 10), R = randn(n, 11);
  std::vector<float> h(n), dg(n), du(n);
  k::swiglu_forward(h.data(), g.data(), u.data(), n);
  k::swiglu_backward(dg.data(), du.data(), R.data(), g.data(), u.data(), n);
  auto loss = [&]() {
    std::vector<float> o(n);
    k::swiglu_forward(o.data(), g.data(), u.data(), n);
    return dot(o, R);
  };
  for (size_t i = 0; i < n; ++i) {
    CHECK(dg[i] == doctest::Approx(fd(g, i, loss)).epsilon(2e-2).scale(1));
    CHECK(du[i] == doctest::Approx(fd(u, i, loss)).epsilon(2e-2).scale(1));
  }

  const int N = 4, V = 11;
  auto logits = randn(N * V, 12, 2.0f);
  std::vector<int32_t> t = {3, 0, 10, 5};
  std::vector<uint8_t> m = {1, 0, 1, 1};
  std::vector<float> dl(N * V);
  double total =
      k::cross_entropy_forward_backward(dl.data(), logits.data(), t.data(), m.data(), N, V, 0.5f);
  double expect = 0;
  for (int n2 = 0; n2 < N; ++n2) {
    if (!m[n2]) continue;
    double z = 0;
    for (int j = 0; j < V; ++j) z += std::exp(double(logits[n2 * V + j]));
    expect += std::log(z) - logits[n2 * V + t[n2]];
  }
  CHECK(total == doctest::Approx(expect).epsilon(1e-6));
  auto ce = [&]() {
    return 0.5 *
           k::cross_entropy_forward_backward(nullptr, logits.data(), t.data(), m.data(), N, V, 0.f);
  };
  for (size_t i = 0; i < logits.size(); ++i)
    CHECK(dl[i] == doctest::Approx(fd(logits, i, ce, 1e-2f)).epsilon(2e-2).scale(1e-3));
  for (int j = 0; j < V; ++j) CHECK(dl[1 * V + j] == 0.0f);  // masked row: no gradient
}

TEST_CASE("adamw_update follows torch.optim.AdamW step by step") {
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  std::vector<float> p = {0.5f, -1.0f, 2.0f}, m(3, 0.f), v(3, 0.f);
  std::vector<double> P(p.begin(), p.end()), M(3, 0.0), Vv(3, 0.0);
  for (int t = 1; t <= 3; ++t) {
    std::vector<float> g = {0.1f * t, -0.2f, 0.05f};
    k::adamw_update(p.data(), g.data(), m.data(), v.data(), 3, lr, b1, b2, eps, wd, t);
    for (int i = 0; i < 3; ++i) {
      P[i] *= 1.0 - double(lr) * wd;
      M[i] = b1 * M[i] + (1 - b1) * double(g[i]);
      Vv[i] = b2 * Vv[i] + (1 - b2) * double(g[i]) * g[i];
      double mh = M[i] / (1 - std::pow(double(b1), t)), vh = Vv[i] / (1 - std::pow(double(b2), t));
      P[i] -= lr * mh / (std::sqrt(vh) + eps);
      CHECK(p[i] == doctest::Approx(P[i]).epsilon(1e-6));
    }
  }
}

TEST_CASE("embedding backward accumulates duplicate ids") {
  const int N = 4, C = 3;
  std::vector<int32_t> ids = {2, 0, 2, 2};
  std::vector<float> dout(N * C, 1.0f), table(3 * C, 0.f);
  k::embedding_backward(table.data(), ids.data(), dout.data(), N, C);
  CHECK(table[0] == 1.0f);
  CHECK(table[C] == 0.0f);
  CHECK(table[2 * C] == 3.0f);
}
