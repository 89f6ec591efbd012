// FlashAttention-2 kernels (kernels/cpu/attention.cpp) against a materialising reference in
// double (the softmax probabilities (B, H, T, T) kept, as the kernel before it did), at sizes
// around the tile (kAttnTile ± 1), odd sizes (1, 19, 111), head dims 8 and 64 and GQA ratios
// 1, 2, 4; determinism across thread counts; bf16 and f16 against the fp32 kernel; document
// segments against the reference run on each document as a sample of its own.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/half.h"
#include "kernels/kernels.h"
#include "random_values.h"

namespace k = ft::kernels;

namespace {
using ft::unit_test::randn;

struct Shape {
  int B, T, H, K, D;
};

// The materialising reference, in double: P = softmax(Q Kᵀ / sqrt(D) + causal mask) kept whole,
// then dP = dO Vᵀ, dS = P ∘ (dP − rowsum(dP ∘ P)), dQ = dS K / sqrt(D), dK = Σ dSᵀ Q / sqrt(D),
// dV = Σ Pᵀ dO over the query heads of a kv head.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

Reference reference(const Shape& s, const std::vector<float>& q, const std::vector<float>& kk,
                    const std::vector<float>& v, const std::vector<float>& dout) {
  const int B = s.B, T = s.T, H = s.H, K = s.K, D = s.D, group = H / K;
  const double scale = 1.0 / std::sqrt(double(D));
  Reference r;
  r.out.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(kk.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  r.lse.assign(size_t(B) * H * T, 0.0);
  // Element (b, t, head, e) of a (B, T, heads, D) tensor.
  auto at = [&](const std::vector<float>& x, int heads, int b, int t, int h, int e) {
    return double(x[((size_t(b) * T + t) * heads + h) * D + e]);
  };
  auto Q = [&](int b, int t, int h, int e) { return at(q, H, b, t, h, e); };
  auto Kx = [&](int b, int t, int h, int e) { return at(kk, K, b, t, h, e); };
  auto V = [&](int b, int t, int h, int e) { return at(v, K, b, t, h, e); };
  auto dO = [&](int b, int t, int h, int e) { return at(dout, H, b, t, h, e); };
  std::vector<double> P(size_t(T) * T), dS(size_t(T) * T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int kh = h / group;
      std::fill(P.begin(), P.end(), 0.0);
      for (int i = 0; i < T; ++i) {
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int e = 0; e < D; ++e) d += Q(b, i, h, e) * Kx(b, j, kh, e);
          P[size_t(i) * T + j] = d * scale;
          mx = std::max(mx, d * scale);
        }
        double z = 0;
        for (int j = 0; j <= i; ++j) z += std::exp(P[size_t(i) * T + j] - mx);
        for (int j = 0; j <= i; ++j) P[size_t(i) * T + j] = std::exp(P[size_t(i) * T + j] - mx) / z;
        r.lse[(size_t(b) * H + h) * T + i] = mx + std::log(z);
        for (int e = 0; e < D; ++e) {
          double o = 0;
          for (int j = 0; j <= i; ++j) o += P[size_t(i) * T + j] * V(b, j, kh, e);
          r.out[((size_t(b) * T + i) * H + h) * D + e] = o;
        }
      }
      for (int i = 0; i < T; ++i) {
        double rowdot = 0;
        for (int j = 0; j <= i; ++j) {
          double dp = 0;
          for (int e = 0; e < D; ++e) dp += dO(b, i, h, e) * V(b, j, kh, e);
          dS[size_t(i) * T + j] = dp;
          rowdot += dp * P[size_t(i) * T + j];
        }
        for (int j = 0; j <= i; ++j)
          dS[size_t(i) * T + j] = P[size_t(i) * T + j] * (dS[size_t(i) * T + j] - rowdot);
      }
      for (int i = 0; i < T; ++i)
        for (int j = 0; j <= i; ++j) {
          const double p = P[size_t(i) * T + j], ds = dS[size_t(i) * T + j];
          for (int e = 0; e < D; ++e) {
            r.dq[((size_t(b) * T + i) * H + h) * D + e] += ds * Kx(b, j, kh, e) * scale;
            r.dk[((size_t(b) * T + j) * K + kh) * D + e] += ds * Q(b, i, h, e) * scale;
            r.dv[((size_t(b) * T + j) * K + kh) * D + e] += p * dO(b, i, h, e);
          }
        }
    }
  return r;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double a : x) m = std::max(m, std::abs(a));
  return m;
}

// Every element within tol_max · max(max|ref|, 1) + tol_rel · |ref|; reports the first that is
// not. The floor 1 is the inputs' scale (O(1) values): a gradient that is exactly 0 in the
// reference (T = 1: one key, a constant softmax) comes out as fp32 noise of that scale.
template <typename V>
void check_close(const std::string& what, const V& got, const std::vector<double>& ref,
                 double tol_max, double tol_rel) {
  REQUIRE(got.size() == ref.size());
  const double m = std::max(max_abs(ref), 1.0);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(std::abs(double(got[i]) - ref[i]) <= tol_max * m + tol_rel * std::abs(ref[i])))
      if (bad++ == 0) first = i;
  CAPTURE(what);
  CAPTURE(first);
  CAPTURE(double(got[first]));
  CAPTURE(ref[first]);
  CHECK(bad == 0);
}

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

Result run_f32(const Shape& s, const std::vector<float>& q, const std::vector<float>& kk,
               const std::vector<float>& v, const std::vector<float>& dout,
               const int32_t* seg = nullptr) {
  Result r;
  r.out.resize(q.size());
  r.lse.resize(size_t(s.B) * s.H * s.T);
  r.dq.assign(q.size(), NAN);  // overwritten, never accumulated into
  r.dk.assign(kk.size(), NAN);
  r.dv.assign(v.size(), NAN);
  k::attention_forward(r.out.data(), r.lse.data(), q.data(), kk.data(), v.data(), s.B, s.T, s.H,
                       s.K, s.D, seg);
  // Δ (B, H, T); NaN so that a read before the kernel writes it shows.
  std::vector<float> work(k::attention_backward_scratch_elems<float>(s.B, s.T, s.H, s.D), NAN);
  k::attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), r.out.data(),
                        r.lse.data(), q.data(), kk.data(), v.data(), work.data(), s.B, s.T, s.H,
                        s.K, s.D, seg);
  return r;
}

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }
}  // namespace

TEST_CASE("attention (FlashAttention-2) matches the materialising reference, forward, backward") {
  const int t = k::kAttnTile;
  // T: one token, odd sizes, one tile, tile ± 1, two tiles ± 1. D 8 and 64. H/K = 1, 2, 4.
  std::vector<Shape> shapes;
  for (int T : {1, 19, 111, t - 1, t, t + 1, 2 * t - 1, 2 * t + 1})
    for (int D : {8, 64})
      for (auto hk : {std::pair{2, 2}, std::pair{4, 2}, std::pair{4, 1}})
        shapes.push_back({T == 19 ? 2 : 1, T, hk.first, hk.second, D});
  uint32_t seed = 10;
  for (const Shape& s : shapes) {
    CAPTURE(s.B);
    CAPTURE(s.T);
    CAPTURE(s.H);
    CAPTURE(s.K);
    CAPTURE(s.D);
    const size_t nq = size_t(s.B) * s.T * s.H * s.D, nk = size_t(s.B) * s.T * s.K * s.D;
    // Scores of a few units (q scaled by 2) so that rows are neither uniform nor one-hot.
    auto q = randn(nq, seed++, 2.0f), kk = randn(nk, seed++), v = randn(nk, seed++),
         dout = randn(nq, seed++);
    const Reference ref = reference(s, q, kk, v, dout);
    const Result got = run_f32(s, q, kk, v, dout);
    // fp32 against double: sums of at most a few hundred products of O(1) terms, rounded in
    // a different order (online softmax, tiles); 5e-6 of the tensor's scale is ~40 fp32 ulps
    // of it (measured worst: 0.2 of this), and the double reference has no error to speak of.
    check_close("out", got.out, ref.out, 5e-6, 5e-6);
    check_close("lse", got.lse, ref.lse, 1e-6, 1e-6);
    check_close("dq", got.dq, ref.dq, 5e-6, 5e-6);
    check_close("dk", got.dk, ref.dk, 5e-6, 5e-6);
    check_close("dv", got.dv, ref.dv, 5e-6, 5e-6);
    if (s.T == 1) {  // one key: a constant softmax, so q and k get exactly no gradient
      CHECK(std::all_of(got.dq.begin(), got.dq.end(), [](float x) { return x == 0.0f; }));
      CHECK(std::all_of(got.dk.begin(), got.dk.end(), [](float x) { return x == 0.0f; }));
    }
  }
}

TEST_CASE("attention with document segments: each document is its own sample") {
  // Two batch rows of 2·kAttnTile + 21 positions packed differently: documents crossing tile
  // edges, one a single token, one document starting on a tile edge. The reference is the
  // materialising one run on each document alone (a sample of its own, batch 1), which knows
  // nothing of segments; so masking both ways (an earlier document, a later key) is checked.
  const int t = k::kAttnTile, T = 2 * t + 21;
  for (auto hk : {std::pair{2, 2}, std::pair{4, 2}, std::pair{4, 1}}) {
    const Shape s{2, T, hk.first, hk.second, 16};
    CAPTURE(s.H);
    CAPTURE(s.K);
    // Document starts per batch row (ids: 10, 11, ... per run; row 1 starts at another id).
    const std::vector<std::vector<int>> starts = {{0, 5, 6, 70, t + 40}, {0, t, t + 1, 2 * t + 3}};
    std::vector<int32_t> seg(size_t(s.B) * T);
    for (int b = 0; b < s.B; ++b)
      for (int tt = 0, id = 10 + 50 * b; tt < T; ++tt) {
        if (tt > 0 && std::find(starts[b].begin(), starts[b].end(), tt) != starts[b].end()) ++id;
        seg[size_t(b) * T + tt] = id;
      }
    const size_t nq = size_t(s.B) * T * s.H * s.D, nk = size_t(s.B) * T * s.K * s.D;
    auto q = randn(nq, 61, 2.0f), kk = randn(nk, 62), v = randn(nk, 63), dout = randn(nq, 64);
    const Result got = run_f32(s, q, kk, v, dout, seg.data());
    for (int b = 0; b < s.B; ++b)
      for (size_t d = 0; d < starts[b].size(); ++d) {
        const int t0 = starts[b][d], t1 = d + 1 < starts[b].size() ? starts[b][d + 1] : T;
        const Shape one{1, t1 - t0, s.H, s.K, s.D};
        CAPTURE(b);
        CAPTURE(t0);
        CAPTURE(t1);
        // Rows [t0, t1) of sample b of a (B, T, heads, D) tensor, and back.
        auto rows = [&](const std::vector<float>& x, int heads) {
          const size_t w = size_t(heads) * s.D, at = (size_t(b) * T + t0) * w;
          return std::vector<float>(x.begin() + at, x.begin() + at + size_t(t1 - t0) * w);
        };
        const Reference ref =
            reference(one, rows(q, s.H), rows(kk, s.K), rows(v, s.K), rows(dout, s.H));
        std::vector<float> lse;  // (H, t1 − t0) of (B, H, T)
        for (int h = 0; h < s.H; ++h) {
          const float* l = got.lse.data() + (size_t(b) * s.H + h) * T;
          lse.insert(lse.end(), l + t0, l + t1);
        }
        // The tolerances of the test above: the same sums, in another order.
        check_close("out", rows(got.out, s.H), ref.out, 5e-6, 5e-6);
        check_close("lse", lse, ref.lse, 1e-6, 1e-6);
        check_close("dq", rows(got.dq, s.H), ref.dq, 5e-6, 5e-6);
        check_close("dk", rows(got.dk, s.K), ref.dk, 5e-6, 5e-6);
        check_close("dv", rows(got.dv, s.K), ref.dv, 5e-6, 5e-6);
      }
    // One id for the whole sample is no masking at all: the bits of seg = nullptr.
    const std::vector<int32_t> one_id(size_t(s.B) * T, 7);
    const Result plain = run_f32(s, q, kk, v, dout),
                 same = run_f32(s, q, kk, v, dout, one_id.data());
    auto bits = [](const std::vector<float>& a, const std::vector<float>& b) {
      return std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
    };
    CHECK(bits(plain.out, same.out));
    CHECK(bits(plain.lse, same.lse));
    CHECK(bits(plain.dq, same.dq));
    CHECK(bits(plain.dk, same.dk));
    CHECK(bits(plain.dv, same.dv));
  }
}

TEST_CASE("attention: the online softmax survives a running max that grows tile after tile") {
  // Keys whose scores rise by ~8 per tile: every key tile raises the running max, so the
  // rescaling exp(m − m') of the output and the sum is exercised with factors far below 1
  // (e^-8 and smaller), and any missed rescale shows at once.
  const Shape s{1, 3 * k::kAttnTile + 7, 2, 1, 16};
  const size_t nq = size_t(s.T) * s.H * s.D, nk = size_t(s.T) * s.K * s.D;
  auto q = randn(nq, 1), kk = randn(nk, 2), v = randn(nk, 3), dout = randn(nq, 4);
  for (int h = 0; h < s.H; ++h)
    for (int tq = 0; tq < s.T; ++tq) q[(size_t(tq) * s.H + h) * s.D] = 4.0f;
  for (int tk = 0; tk < s.T; ++tk) kk[size_t(tk) * s.D] = 8.0f * float(tk) / k::kAttnTile;
  const Reference ref = reference(s, q, kk, v, dout);
  const Result got = run_f32(s, q, kk, v, dout);
  check_close("out", got.out, ref.out, 1e-5, 1e-5);
  check_close("lse", got.lse, ref.lse, 1e-6, 1e-6);
  check_close("dq", got.dq, ref.dq, 1e-5, 1e-5);
  check_close("dk", got.dk, ref.dk, 1e-5, 1e-5);
  check_close("dv", got.dv, ref.dv, 1e-5, 1e-5);
}

TEST_CASE("attention backward is deterministic: the same bits for 1 and 2 threads, run to run") {
  // GQA 4:1 over two batches: the four query heads of a kv head add into the same dK, dV rows.
  const Shape s{2, 2 * k::kAttnTile + 19, 8, 2, 24};
  const size_t nq = size_t(s.B) * s.T * s.H * s.D, nk = size_t(s.B) * s.T * s.K * s.D;
  auto q = randn(nq, 21), kk = randn(nk, 22), v = randn(nk, 23), dout = randn(nq, 24);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Result one = run_f32(s, q, kk, v, dout);
  omp_set_num_threads(2);
  const Result two = run_f32(s, q, kk, v, dout), again = run_f32(s, q, kk, v, dout);
  omp_set_num_threads(saved);
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  };
  for (const Result* r : {&two, &again}) {
    CHECK(same(one.out, r->out));
    CHECK(same(one.lse, r->lse));
    CHECK(same(one.dq, r->dq));
    CHECK(same(one.dk, r->dk));
    CHECK(same(one.dv, r->dv));
  }
}

namespace {
template <typename E>
void check_16bit(double rel) {
  // Inputs rounded to E once; the fp32 kernel on the same (exactly representable) values is the
  // reference. Both run the same fp32 math in the same order, so the only difference is the
  // one rounding of each output to E on store: at most half an ulp, which is up to 2^-8 of |x|
  // for bf16 (7 stored mantissa bits) and 2^-11 for f16 (10 bits, normal range). rel is exactly
  // that (measured: worst element at 0.99 of it, as one rounding gives); the absolute floor 1e-6
  // covers f16 subnormals. Any extra error in the 16-bit path (a second rounding, a 16-bit
  // accumulator) would exceed it.
  for (const Shape& s : {Shape{1, 1, 2, 2, 8}, Shape{2, 19, 4, 2, 8}, Shape{1, 111, 4, 1, 64},
                         Shape{1, k::kAttnTile + 1, 2, 2, 64}}) {
    CAPTURE(s.B);
    CAPTURE(s.T);
    CAPTURE(s.H);
    CAPTURE(s.K);
    CAPTURE(s.D);
    const size_t nq = size_t(s.B) * s.T * s.H * s.D, nk = size_t(s.B) * s.T * s.K * s.D;
    auto q = randn(nq, 31, 2.0f), kk = randn(nk, 32), v = randn(nk, 33), dout = randn(nq, 34);
    auto round = [](std::vector<float>& x) {
      std::vector<E> r(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        r[i] = ft::from_f32<E>(x[i]);
        x[i] = ft::to_f32(r[i]);
      }
      return r;
    };
    const std::vector<E> q16 = round(q), k16 = round(kk), v16 = round(v), do16 = round(dout);
    const Result ref = run_f32(s, q, kk, v, dout);

    std::vector<E> out(nq), dq(nq), dk(nk), dv(nk);
    std::vector<float> lse(size_t(s.B) * s.H * s.T);
    const size_t scratch = k::attention_backward_scratch_elems<E>(s.B, s.T, s.H, s.D);
    CHECK(scratch == size_t(s.B) * s.H * s.T + nq);  // Δ, and dQ accumulated in fp32
    std::vector<float> work(scratch, NAN);           // the kernel must initialise it
    k::attention_forward(out.data(), lse.data(), q16.data(), k16.data(), v16.data(), s.B, s.T, s.H,
                         s.K, s.D);
    // Backward from the fp32 reference's output rounded to E, as a 16-bit model would keep it.
    std::vector<float> ref_out_rounded = ref.out;
    const std::vector<E> o16 = round(ref_out_rounded);
    k::attention_backward(dq.data(), dk.data(), dv.data(), do16.data(), o16.data(), lse.data(),
                          q16.data(), k16.data(), v16.data(), work.data(), s.B, s.T, s.H, s.K, s.D);
    auto wide = [](const std::vector<E>& x) {
      std::vector<float> r(x.size());
      for (size_t i = 0; i < x.size(); ++i) r[i] = ft::to_f32(x[i]);
      return r;
    };
    check_close("out", wide(out), widen(ref.out), 1e-6, rel);
    // lse is fp32 in every instantiation and computed from the same values: equal bits.
    CHECK(std::memcmp(lse.data(), ref.lse.data(), lse.size() * 4) == 0);
    // Δ = rowsum(dO ∘ O) reads O rounded to E, so dq and dk move by up to ~|dS|·2^-9 relative
    // to the fp32 run: compare them against the fp32 kernel given the same rounded O.
    Result ref2 = ref;
    ref2.dq.assign(nq, NAN);
    ref2.dk.assign(nk, NAN);
    ref2.dv.assign(nk, NAN);
    std::vector<float> work32(k::attention_backward_scratch_elems<float>(s.B, s.T, s.H, s.D));
    k::attention_backward(ref2.dq.data(), ref2.dk.data(), ref2.dv.data(), dout.data(),
                          ref_out_rounded.data(), ref.lse.data(), q.data(), kk.data(), v.data(),
                          work32.data(), s.B, s.T, s.H, s.K, s.D);
    check_close("dq", wide(dq), widen(ref2.dq), 1e-6, rel);
    check_close("dk", wide(dk), widen(ref2.dk), 1e-6, rel);
    check_close("dv", wide(dv), widen(ref2.dv), 1e-6, rel);
  }
}
}  // namespace

TEST_CASE("attention in bf16 and f16: the fp32 kernel's result rounded once, on the same inputs") {
  CHECK(k::attention_backward_scratch_elems<float>(2, 19, 4, 8) == 2 * 4 * 19);  // Δ only
  SUBCASE("bf16") { check_16bit<ft::bf16>(std::ldexp(1.0, -8)); }
  SUBCASE("f16") { check_16bit<ft::f16>(std::ldexp(1.0, -11)); }
}
