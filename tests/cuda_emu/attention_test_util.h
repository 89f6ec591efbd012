// What the attention tests of the CUDA kernels share (test_attention.cpp: the SIMT and cuBLASLt
// paths; test_attention_fused.cpp, test_attention_sm90.cpp: the fused kernels), on top of
// kernel_check.h: the shape, inputs rounded to the element type, the closeness check scaled to a
// tensor's largest value, and a CUDA path's forward and backward run under the two schedule seeds,
// compared against the reference and against each other; for the fused kernels, their
// tolerances, segment ids, the CPU reference that runs each document on its own, and a case's
// inputs and checks (FusedCase, check_forward_backward).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "tests/cuda_emu/emu_test_util.h"
#include "tests/cuda_emu/kernel_check.h"

namespace ft::cuda_test::attention {

// q and out (B, T, H, D); k, v (B, T, K, D); lse (B, H, T).
struct Shape {
  int B, T, H, K, D;
};

// "B=… T=… H=… K=… D=…", for the messages.
inline std::string shape_text(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
         " K=" + std::to_string(s.K) + " D=" + std::to_string(s.D);
}

// n normal values of standard deviation scale, rounded to E once.
template <typename E>
std::vector<E> random_tensor(size_t n, uint32_t seed, float scale) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<E> v(n);
  for (auto& x : v) x = ft::from_f32<E>(d(g));
  return v;
}

// Every element within rtol·|ref| + atol_frac·max|ref| (check_close with that scale on every
// element; it names the worst element).
template <typename E>
void expect_close(const std::string& what, const std::vector<E>& got, const std::vector<E>& ref,
                  double rtol, double atol_frac) {
  float amax = 0.0f;
  for (const E& r : ref) amax = std::max(amax, std::fabs(ft::to_f32(r)));
  check_close(got, ref, rtol, atol_frac, std::vector<float>(ref.size(), amax), what);
}

// A forward's out and lse and a backward's gradients.
template <typename E>
struct Result {
  std::vector<E> out, dq, dk, dv;
  std::vector<float> lse;
};

// launch(out, lse, dq, dk, dv) (device pointers) under each of the two schedule seeds, the
// outputs starting as NaN bits so that every element must be written: both runs' results.
template <typename E, typename Launch>
std::pair<Result<E>, Result<E>> run_under_two_seeds(const Shape& s, const Launch& launch) {
  using ft::emu::test::DeviceBuffer;
  const size_t nq = size_t(s.B) * s.T * s.H * s.D, nk = size_t(s.B) * s.T * s.K * s.D;
  const size_t nl = size_t(s.B) * s.H * s.T;
  auto run = [&](uint64_t seed) {
    ft::emu::test::SeedScope scope(seed);
    DeviceBuffer<E> o(nq), gq(nq), gk(nk), gv(nk);
    DeviceBuffer<float> l(nl);
    for (DeviceBuffer<E>* t : {&o, &gq, &gk, &gv})
      REQUIRE(cudaMemset(t->get(), 0xff, sizeof(E) * t->size()) == cudaSuccess);
    REQUIRE(cudaMemset(l.get(), 0xff, sizeof(float) * nl) == cudaSuccess);
    launch(o.get(), l.get(), gq.get(), gk.get(), gv.get());
    return Result<E>{o.to_host(), gq.to_host(), gk.to_host(), gv.to_host(), l.to_host()};
  };
  const std::vector<uint64_t> seeds = ft::emu::test::test_seeds();
  Result<E> a = run(seeds[0]);
  Result<E> b = run(seeds[1]);
  return {std::move(a), std::move(b)};
}

// a against ref: out, dq, dk and dv within (rtol, atol_frac), lse within (lse_rtol,
// lse_atol_frac); then a against b (the other schedule seed's run) bit for bit. where starts
// each message.
template <typename E>
void expect_matches(const std::string& where, const Result<E>& a, const Result<E>& b,
                    const Result<E>& ref, double rtol, double atol_frac, double lse_rtol,
                    double lse_atol_frac) {
  expect_close<E>(where + "out", a.out, ref.out, rtol, atol_frac);
  expect_close<float>(where + "lse", a.lse, ref.lse, lse_rtol, lse_atol_frac);
  expect_close<E>(where + "dq", a.dq, ref.dq, rtol, atol_frac);
  expect_close<E>(where + "dk", a.dk, ref.dk, rtol, atol_frac);
  expect_close<E>(where + "dv", a.dv, ref.dv, rtol, atol_frac);
  CHECK_MESSAGE(same_bits(a.out, b.out), where << "out differs between schedule seeds");
  CHECK_MESSAGE(same_bits(a.lse, b.lse), where << "lse differs between schedule seeds");
  CHECK_MESSAGE(same_bits(a.dq, b.dq), where << "dq differs between schedule seeds");
  CHECK_MESSAGE(same_bits(a.dk, b.dk), where << "dk differs between schedule seeds");
  CHECK_MESSAGE(same_bits(a.dv, b.dv), where << "dv differs between schedule seeds");
}

// ---- The fused kernels' tests (test_attention_fused.cpp, test_attention_sm90.cpp) ----
//
// Tolerances (rtol, atol as a fraction of the tensor's max |ref|), those of the tensor-core
// path of test_attention.cpp: the CPU computes in fp32 and rounds each output once, so one
// rounding of E (2^-8 bf16, 2^-11 f16 relative) can land either side: rtol two units of it.
// The fused kernels (attention_fused.cu, attention_sm90.cu) also round P (before P·V and
// Pᵀ·dO) and dS (before dS·K and dSᵀ·Q) to E, as every tensor-core attention does; each product
// term then carries up to one more rounding of E, and a gradient that cancels (dQ, dK: terms of
// both signs) keeps that error at the scale of its largest terms: atol two units of E's rounding of
// the tensor's largest value. Measured on the emulator (attention_fused.cu): the worst element of
// every case is within 0.33 of its bound (out, dq, dk, dv, bf16 and f16 alike); lse within 0.22
// (f16) and 0.02 (bf16) of its bound.
template <typename E>
constexpr double kFusedRtol = std::is_same_v<E, ft::bf16> ? 2.0 / 128 : 2.0 / 1024;
template <typename E>
constexpr double kFusedAtolFrac = std::is_same_v<E, ft::bf16> ? 2.0 / 256 : 2.0 / 2048;
// lse is fp32 on both sides from the same scores (exact products, fp32 sums in another order;
// exp2 of a fused multiply-add here, exp on the CPU): a few fp32 ulp of values of a few units.
constexpr double kFusedLseRtol = 1e-5, kFusedLseAtolFrac = 1e-6;

// Segment ids (B, T), non-decreasing: documents of a few lengths, including one of a single
// token, shifted per batch row. Each row's ids start at 0; continued: at the previous row's last
// id, each row starting with a one-token document too. A kernel that took a row's first query's
// "sees one key" flag from the id before it (the previous row's last) would then take that query
// for a later token of the same document and leave rounding noise in its gradients, which the
// contract makes exactly 0 (expect_first_tokens_zero).
inline std::vector<int32_t> make_segments(int B, int T, bool continued = false) {
  std::vector<int32_t> seg(size_t(B) * T);
  for (int b = 0; b < B; ++b) {
    // Boundaries (first tokens of documents after the first): a third in, the token after it
    // (a one-token document), two thirds in, and one 7 tokens from the end; continued: also the
    // second token (the first is a one-token document).
    const int cuts[] = {continued ? 1 : 0, T / 3 + b, T / 3 + b + 1, 2 * T / 3, T - 7};
    int id = continued && b > 0 ? seg[size_t(b) * T - 1] : 0;
    for (int t = 0; t < T; ++t) {
      for (int c : cuts)
        if (c > 0 && t == c) ++id;
      seg[size_t(b) * T + t] = id;
    }
  }
  return seg;
}

// The CPU reference: the CPU kernel on each document span [s, e) of each batch row (rows of
// (B, T, ·, D) tensors are contiguous, so a span is a (1, e − s, ·, D) tensor; lse is gathered
// and scattered per head).
template <typename E>
Result<E> document_reference(const Shape& s, const std::vector<int32_t>& seg,
                             const std::vector<E>& q, const std::vector<E>& kk,
                             const std::vector<E>& v, const std::vector<E>& dout) {
  const auto [B, T, H, K, D] = s;
  const size_t nq = size_t(B) * T * H * D, nk = size_t(B) * T * K * D;
  Result<E> r{std::vector<E>(nq), std::vector<E>(nq), std::vector<E>(nk), std::vector<E>(nk),
              std::vector<float>(size_t(B) * H * T)};
  for (int b = 0; b < B; ++b)
    for (int t0 = 0; t0 < T;) {
      int t1 = t0 + 1;
      while (!seg.empty() && t1 < T && seg[size_t(b) * T + t1] == seg[size_t(b) * T + t0]) ++t1;
      if (seg.empty()) t1 = T;
      const int n = t1 - t0;
      const size_t oq = (size_t(b) * T + t0) * H * D, ok = (size_t(b) * T + t0) * K * D;
      std::vector<float> lse(size_t(H) * n),
          scratch(ft::kernels::attention_backward_scratch_elems<E>(1, n, H, D));
      ft::kernels::attention_forward<E>(r.out.data() + oq, lse.data(), q.data() + oq,
                                        kk.data() + ok, v.data() + ok, 1, n, H, K, D);
      ft::kernels::attention_backward<E>(
          r.dq.data() + oq, r.dk.data() + ok, r.dv.data() + ok, dout.data() + oq, r.out.data() + oq,
          lse.data(), q.data() + oq, kk.data() + ok, v.data() + ok, scratch.data(), 1, n, H, K, D);
      for (int h = 0; h < H; ++h)
        std::copy_n(lse.data() + size_t(h) * n, n, r.lse.data() + (size_t(b) * H + h) * T + t0);
      t0 = t1;
    }
  return r;
}

// A fused kernel's case: inputs rounded to E (scores of a few units: softmax rows neither
// uniform nor one-hot), segment ids (B, T) or none (empty), the CPU reference, and the device
// copies the kernels read. The backward reads the reference's out and lse, so that each pass is
// compared on the same inputs as the CPU's.
template <typename E>
struct FusedCase {
  FusedCase(const Shape& shape, std::vector<int32_t> segments)
      : s(shape),
        seg(std::move(segments)),
        q(random_tensor<E>(size_t(s.B) * s.T * s.H * s.D, 1, 1.5f)),
        k(random_tensor<E>(size_t(s.B) * s.T * s.K * s.D, 2, 1.5f)),
        v(random_tensor<E>(size_t(s.B) * s.T * s.K * s.D, 3, 1.0f)),
        dout(random_tensor<E>(size_t(s.B) * s.T * s.H * s.D, 4, 1.0f)),
        ref(document_reference(s, seg, q, k, v, dout)),
        q_d(q),
        k_d(k),
        v_d(v),
        dout_d(dout),
        out_ref_d(ref.out),
        lse_ref_d(ref.lse),
        seg_d(seg.empty() ? std::vector<int32_t>(1) : seg) {}

  // The kernels' seg argument: nullptr without segments.
  const int32_t* seg_ptr() const { return seg.empty() ? nullptr : seg_d.get(); }
  // "<kernel> <dtype> B=… T=… H=… K=… D=… [segments ]", to start each message.
  std::string where(const std::string& kernel) const {
    return kernel + " " + type_name<E>() + " " + shape_text(s) + (seg.empty() ? " " : " segments ");
  }

  Shape s;
  std::vector<int32_t> seg;
  std::vector<E> q, k, v, dout;  // q, dout (B, T, H, D); k, v (B, T, K, D)
  Result<E> ref;
  ft::emu::test::DeviceBuffer<E> q_d, k_d, v_d, dout_d, out_ref_d;
  ft::emu::test::DeviceBuffer<float> lse_ref_d;
  ft::emu::test::DeviceBuffer<int32_t> seg_d;  // one unused id without segments
};

// A fused kernel's forward and backward (functions of attention_fused_forward's and
// attention_fused_backward's signatures) on c's inputs, under the two schedule seeds: every
// result within the fused tolerances of the reference, and the same bits under both seeds.
// where starts each message. Returns the first seed's results.
template <typename E, typename Forward, typename Backward>
Result<E> check_forward_backward(const std::string& where, const FusedCase<E>& c, Forward forward,
                                 Backward backward) {
  const auto [B, T, H, K, D] = c.s;
  auto launch = [&](E* o, float* l, E* gq, E* gk, E* gv) {
    forward(o, l, c.q_d.get(), c.k_d.get(), c.v_d.get(), c.seg_ptr(), B, T, H, K, D, nullptr);
    ft::emu::test::DeviceBuffer<unsigned char> scratch(
        ft::kernels::cuda::attention_fused_backward_scratch_bytes(B, T, H));
    backward(gq, gk, gv, c.dout_d.get(), c.out_ref_d.get(), c.lse_ref_d.get(), c.q_d.get(),
             c.k_d.get(), c.v_d.get(), c.seg_ptr(), scratch.get(), B, T, H, K, D, nullptr);
  };
  const auto [a, b] = run_under_two_seeds<E>(c.s, launch);
  expect_matches<E>(where, a, b, c.ref, kFusedRtol<E>, kFusedAtolFrac<E>, kFusedLseRtol,
                    kFusedLseAtolFrac);
  return a;
}

// The contract's exact zeros (kernels_cuda.h: the first token of each document gets a zero
// gradient): dq of each document's first query (it sees one key, itself: dS = P (dP − Δ) is 0
// with P = 1 and dP = Δ) and dk of a one-token document's key (no other query sees it), all
// bits, as in the reference. The fused kernels force that dS to 0 by a "sees one key" flag;
// without it (or with a wrong one) these hold rounding noise, far inside expect_close's bounds,
// so only this check tells.
template <typename E>
void expect_first_tokens_zero(const std::string& where, const FusedCase<E>& c,
                              const Result<E>& got) {
  const auto [B, T, H, K, D] = c.s;
  const auto id = [&](int b, int t) { return c.seg.empty() ? 0 : c.seg[size_t(b) * T + t]; };
  const auto zeros = [](const std::vector<E>& x, size_t at, size_t n) {
    return std::all_of(x.begin() + at, x.begin() + at + n,
                       [](const E& e) { return ft::to_f32(e) == 0.0f; });
  };
  int rows = 0, bad_dq = 0, bad_dk = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      if (t > 0 && id(b, t - 1) == id(b, t)) continue;  // not a document's first token
      ++rows;
      const size_t oq = (size_t(b) * T + t) * H * D, ok = (size_t(b) * T + t) * K * D;
      REQUIRE(zeros(c.ref.dq, oq, size_t(H) * D));
      bad_dq += !zeros(got.dq, oq, size_t(H) * D);
      if (t + 1 < T && id(b, t + 1) == id(b, t)) continue;  // not a one-token document
      REQUIRE(zeros(c.ref.dk, ok, size_t(K) * D));
      bad_dk += !zeros(got.dk, ok, size_t(K) * D);
    }
  CHECK_MESSAGE(bad_dq == 0, where << "dq: " << bad_dq << " of " << rows
                                   << " documents' first tokens not exactly 0");
  CHECK_MESSAGE(bad_dk == 0, where << "dk: " << bad_dk << " one-token documents not exactly 0");
}

}  // namespace ft::cuda_test::attention
