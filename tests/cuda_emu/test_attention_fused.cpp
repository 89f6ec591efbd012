// The fused tensor-core attention (kernels/cuda/attention_fused.cu: FlashAttention-2 with
// mma.sync, ldmatrix and cp.async), run by the CUDA emulator (a test tool: every CUDA thread a
// fiber on the CPU; nothing here says anything about GPU speed), against the CPU kernels of
// kernels/cpu/attention.cpp.
//
// Shapes: T = 1, 19 (inside one 64-row tile), 111 (two tiles with a tail) and 300 (five tiles,
// a 44-row tail); head dims 64 and 128; GQA ratios 1, 2 and 4; bf16 and f16. Each shape runs
// without document masking and with segment ids (documents of several lengths, one of a single
// token, different per batch row). The reference runs the CPU kernel without segments on each
// document's span on its own (a document is a causal sequence of its own), which is the fused
// kernel's contract, independently of the CPU kernel's own segment path (tested in unit). Inputs
// are rounded to E once, so both sides read the same values. The backward reads the reference's out
// and lse, so each pass is compared on the same inputs. Each case runs the fused kernels under two
// schedule seeds and requires the same bits (deterministic: no float atomics). Built natively
// (ft_cuda_kernel_tests) the same cases run on a GPU. dev/attention/ builds this file again
// against the tuning lab's launchers, which run the kernels' other forms (FT_CUDA_FUSED_TUNING).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "lib/core/error.h"
#include "tests/cuda_emu/attention_test_util.h"
#include "tests/cuda_emu/emu_test_util.h"
#include "tests/cuda_emu/kernel_check.h"

namespace k = ft::kernels;
namespace cu = ft::kernels::cuda;

namespace {

using ft::cuda_test::attention::random_tensor;
using ft::cuda_test::attention::Result;
using ft::cuda_test::attention::Shape;
using ft::emu::test::DeviceBuffer;

// Tolerances (rtol, atol as a fraction of the tensor's max |ref|), those of the tensor-core
// path of test_attention.cpp: the CPU computes in fp32 and rounds each output once, so one
// rounding of E (2^-8 bf16, 2^-11 f16 relative) can land either side: rtol two units of it.
// The fused kernel also rounds P (before P·V and Pᵀ·dO) and dS (before dS·K and dSᵀ·Q) to E,
// as every tensor-core attention does; each product term then carries up to one more rounding
// of E, and a gradient that cancels (dQ, dK: terms of both signs) keeps that error at the
// scale of its largest terms: atol two units of E's rounding of the tensor's largest value.
// Measured on the emulator: the worst element of every case is within 0.33 of its bound (out,
// dq, dk, dv, bf16 and f16 alike); lse within 0.22 (f16) and 0.02 (bf16) of its bound.
template <typename E>
constexpr double kRtol = std::is_same_v<E, ft::bf16> ? 2.0 / 128 : 2.0 / 1024;
template <typename E>
constexpr double kAtolFrac = std::is_same_v<E, ft::bf16> ? 2.0 / 256 : 2.0 / 2048;
// lse is fp32 on both sides from the same scores (exact products, fp32 sums in another order;
// exp2 of a fused multiply-add here, exp on the CPU): a few fp32 ulp of values of a few units.
constexpr double kLseRtol = 1e-5, kLseAtolFrac = 1e-6;

// Segment ids (B, T), non-decreasing: documents of a few lengths, including one of a single
// token, shifted per batch row. Empty with_segments = false.
std::vector<int32_t> make_segments(int B, int T) {
  std::vector<int32_t> seg(size_t(B) * T);
  for (int b = 0; b < B; ++b) {
    // Boundaries (first tokens of documents after the first): a third in, the token after it
    // (a one-token document), two thirds in, and one 7 tokens from the end.
    const int cuts[] = {T / 3 + b, T / 3 + b + 1, 2 * T / 3, T - 7};
    int id = 0;
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
Result<E> reference(const Shape& s, const std::vector<int32_t>& seg, const std::vector<E>& q,
                    const std::vector<E>& kk, const std::vector<E>& v, const std::vector<E>& dout) {
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
          scratch(k::attention_backward_scratch_elems<E>(1, n, H, D));
      k::attention_forward<E>(r.out.data() + oq, lse.data(), q.data() + oq, kk.data() + ok,
                              v.data() + ok, 1, n, H, K, D);
      k::attention_backward<E>(r.dq.data() + oq, r.dk.data() + ok, r.dv.data() + ok,
                               dout.data() + oq, r.out.data() + oq, lse.data(), q.data() + oq,
                               kk.data() + ok, v.data() + ok, scratch.data(), 1, n, H, K, D);
      for (int h = 0; h < H; ++h)
        std::copy_n(lse.data() + size_t(h) * n, n, r.lse.data() + (size_t(b) * H + h) * T + t0);
      t0 = t1;
    }
  return r;
}

template <typename E>
void check_case(const Shape& s, bool with_segments) {
  const auto [B, T, H, K, D] = s;
  const size_t nq = size_t(B) * T * H * D, nk = size_t(B) * T * K * D;
  // Scores of a few units: softmax rows neither uniform nor one-hot.
  const auto q = random_tensor<E>(nq, 1, 1.5f), kk = random_tensor<E>(nk, 2, 1.5f);
  const auto v = random_tensor<E>(nk, 3, 1.0f), dout = random_tensor<E>(nq, 4, 1.0f);
  const std::vector<int32_t> seg = with_segments ? make_segments(B, T) : std::vector<int32_t>{};
  const Result<E> ref = reference(s, seg, q, kk, v, dout);

  const DeviceBuffer<E> q_d(q), k_d(kk), v_d(v), dout_d(dout), out_ref_d(ref.out);
  const DeviceBuffer<float> lse_ref_d(ref.lse);
  const DeviceBuffer<int32_t> seg_d(seg.empty() ? std::vector<int32_t>(1) : seg);
  const int32_t* seg_p = with_segments ? seg_d.get() : nullptr;
  auto launch = [&](E* o, float* l, E* gq, E* gk, E* gv) {
    cu::attention_fused_forward<E>(o, l, q_d.get(), k_d.get(), v_d.get(), seg_p, B, T, H, K, D,
                                   nullptr);
    DeviceBuffer<unsigned char> scratch(cu::attention_fused_backward_scratch_bytes(B, T, H));
    cu::attention_fused_backward<E>(gq, gk, gv, dout_d.get(), out_ref_d.get(), lse_ref_d.get(),
                                    q_d.get(), k_d.get(), v_d.get(), seg_p, scratch.get(), B, T, H,
                                    K, D, nullptr);
  };
  const auto [a, b] = ft::cuda_test::attention::run_under_two_seeds<E>(s, launch);

  const std::string where = std::string("fused ") + ft::cuda_test::type_name<E>() + " " +
                            ft::cuda_test::attention::shape_text(s) +
                            (with_segments ? " segments " : " ");
  ft::cuda_test::attention::expect_matches<E>(where, a, b, ref, kRtol<E>, kAtolFrac<E>, kLseRtol,
                                              kLseAtolFrac);
}

// Small B and H: the emulator switches fibers at every mma, ldmatrix and barrier.
const Shape kShapes[] = {
    {1, 1, 1, 1, 64},     // one token
    {1, 19, 2, 1, 128},   // GQA 2, inside one tile
    {2, 111, 4, 1, 64},   // GQA 4, two batch rows, a tail
    {1, 111, 2, 2, 128},  // GQA 1
    {1, 300, 2, 1, 64},   // five tiles
    {1, 300, 2, 1, 128},
};

template <typename E>
void check_all() {
  for (const Shape& s : kShapes)
    for (bool segments : {false, true})
      if (!segments || s.T > 1) check_case<E>(s, segments);
}

}  // namespace

TEST_CASE("cuda_emu fused attention bf16 against the CPU kernels") { check_all<ft::bf16>(); }
TEST_CASE("cuda_emu fused attention f16 against the CPU kernels") { check_all<ft::f16>(); }

TEST_CASE("cuda_emu fused attention rejects what it cannot run") {
  CHECK(cu::attention_fused_supported(64));
  CHECK(cu::attention_fused_supported(128));
  CHECK_FALSE(cu::attention_fused_supported(96));
  DeviceBuffer<ft::bf16> x(4096);
  DeviceBuffer<float> lse(64);
  // Head dim 96: only 64 and 128 are instantiated.
  CHECK_THROWS_AS(cu::attention_fused_forward<ft::bf16>(x.get(), lse.get(), x.get(), x.get(),
                                                        x.get(), nullptr, 1, 2, 1, 1, 96, nullptr),
                  ft::Error);
  // H not a multiple of K.
  CHECK_THROWS_AS(cu::attention_fused_backward<ft::bf16>(
                      x.get(), x.get(), x.get(), x.get(), x.get(), lse.get(), x.get(), x.get(),
                      x.get(), nullptr, lse.get(), 1, 2, 3, 2, 64, nullptr),
                  ft::Error);
  // A view one element in: cp.async copies 16 aligned bytes.
  CHECK_THROWS_AS(cu::attention_fused_forward<ft::bf16>(x.get(), lse.get(), x.get() + 1, x.get(),
                                                        x.get(), nullptr, 1, 2, 1, 1, 64, nullptr),
                  ft::Error);
}
