// The Hopper attention forward and backward (kernels/cuda/attention_sm90.cu: TMA, mbarrier ring,
// wgmma) run by the CUDA emulator (every thread a fiber; it checks the mbarrier, TMA and wgmma
// ordering rules as it goes: tests/cuda_emu/hopper_emu.cpp) against the CPU kernels, with the fused
// kernel's reference and tolerances (attention_test_util.h: the same rounding of P to E; measured
// on the emulator, the worst element of every case is within 0.28 (bf16) and 0.22 (f16) of the
// bound for out, 0.02 and 0.04 for lse). Built natively (ft_cuda_kernel_tests) the same cases
// run on an sm_90 GPU and skip on older ones.
//
// Shapes are small (a block is 288 or 384 fibers; each case takes seconds): tails (T not a multiple
// of 64 or of a block's 128 rows, so that a block has a consumer warpgroup with no rows), each of
// the three ring stages used thrice (T 400: seven key tiles, where a barrier's parity repeats),
// both warpgroups over several tiles (T 260, 300: the ping-pong), GQA ratios 1, 2 and 4, head dims
// 64 and 128, two batch rows, one token; each with and without segment ids. Each case runs under
// two schedule seeds and requires the same bits. The backward's cases (on the reference's out and
// lse, as the fused kernel's test) take the fused kernel's tolerances too (measured on the
// emulator: the worst element of dq, dk and dv within 0.30 of the bound in bf16, 0.32 in f16): one
// token, GQA 1 and 2 at both head dims, GQA 4 at 64, tails, two batch rows with and without
// segments, segments (a one-token document: a query whose dS is forced to 0), ids continuing across
// rows, both dtypes; and the contract's exact zeros (each document's first query's dq, a one-token
// document's dk). Every case with more than one tile a block (T 200, 130, 100, 70) runs both
// kernels' ping-pong over several turns, with a warpgroup that skips tiles (dK/dV's second, each
// head's first query tile; dQ's first, the second's diagonal tile), and at head dim 64 dK/dV's
// overlap of a tile's softmax with the previous tile's products, across heads with GQA: a turn
// missed or taken twice is a deadlock, which the emulator reports (tried: dK/dV's skipped tile
// taking one turn of its two at head dim 128, none at 64, dQ's waited tiles taking none); it also
// reports a stage released before the products reading it completed (tried: dK/dV's overlap
// arriving on `empty` before its wait_group 0: its Q tile changed under the wgmma) and a wgmma
// reading a tile before its barrier's phase was observed (tried: dQ's S = Q Kᵀ without the wait on
// `full_k`).
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/kernels_cuda.h"
#include "lib/core/error.h"
#include "tests/cuda_emu/attention_test_util.h"
#include "tests/cuda_emu/emu_test_util.h"
#include "tests/cuda_emu/kernel_check.h"

namespace cu = ft::kernels::cuda;

namespace {

using ft::cuda_test::attention::check_forward_backward;
using ft::cuda_test::attention::expect_close;
using ft::cuda_test::attention::expect_first_tokens_zero;
using ft::cuda_test::attention::FusedCase;
using ft::cuda_test::attention::kFusedAtolFrac;
using ft::cuda_test::attention::kFusedLseAtolFrac;
using ft::cuda_test::attention::kFusedLseRtol;
using ft::cuda_test::attention::kFusedRtol;
using ft::cuda_test::attention::make_segments;
using ft::cuda_test::attention::Result;
using ft::cuda_test::attention::Shape;
using ft::emu::test::DeviceBuffer;

bool sm90_here() {
  if (!cu::attention_sm90_available()) {
    MESSAGE("skipped: the sm_90 attention needs a GPU of compute capability 9.x");
    return false;
  }
  return true;
}

template <typename E>
void check_case(const Shape& s, bool with_segments) {
  const FusedCase<E> c(s, with_segments ? make_segments(s.B, s.T) : std::vector<int32_t>{});
  auto launch = [&](E* o, float* l, E*, E*, E*) {
    cu::attention_sm90_forward<E>(o, l, c.q_d.get(), c.k_d.get(), c.v_d.get(), c.seg_ptr(), s.B,
                                  s.T, s.H, s.K, s.D, nullptr);
  };
  const auto [a, b] = ft::cuda_test::attention::run_under_two_seeds<E>(s, launch);

  const std::string where = c.where("sm90");
  expect_close<E>(where + "out", a.out, c.ref.out, kFusedRtol<E>, kFusedAtolFrac<E>);
  expect_close<float>(where + "lse", a.lse, c.ref.lse, kFusedLseRtol, kFusedLseAtolFrac);
  CHECK_MESSAGE(ft::cuda_test::same_bits(a.out, b.out), where << "out differs between seeds");
  CHECK_MESSAGE(ft::cuda_test::same_bits(a.lse, b.lse), where << "lse differs between seeds");
}

// The backward (attention_sm90_backward) on the reference's out and lse, so that it is compared
// on the same inputs as the CPU's; the forward is run too (the Result carries both). seg: (B, T)
// ids or empty.
template <typename E>
void check_backward_case(const Shape& s, std::vector<int32_t> seg) {
  const FusedCase<E> c(s, std::move(seg));
  const std::string where = c.where("sm90 backward");
  const Result<E> a = check_forward_backward<E>(where, c, cu::attention_sm90_forward<E>,
                                                cu::attention_sm90_backward<E>);
  expect_first_tokens_zero<E>(where, c, a);
}

template <typename E>
void check_backward_case(const Shape& s, bool with_segments) {
  check_backward_case<E>(s, with_segments ? make_segments(s.B, s.T) : std::vector<int32_t>{});
}

template <typename E>
void check_shapes(std::initializer_list<Shape> shapes) {
  for (const Shape& s : shapes)
    for (bool segments : {false, true})
      if (!segments || s.T > 1) check_case<E>(s, segments);
}

}  // namespace

TEST_CASE("cuda_emu sm90 attention forward bf16 head dim 64 against the CPU kernels") {
  if (!sm90_here()) return;
  check_shapes<ft::bf16>({
      {1, 1, 1, 1, 64},    // one token
      {1, 100, 2, 1, 64},  // GQA 2, a tail inside the block's second warpgroup
      {1, 192, 4, 1, 64},  // GQA 4, three key tiles, an idle warpgroup
      {2, 70, 1, 1, 64},   // two batch rows: rows past T read as zeros, never another row's
      {1, 300, 2, 1, 64},  // both warpgroups over several tiles: the ping-pong's turns
  });
  // The last block's seven key tiles use each of the three ring stages thrice (no segments:
  // they would cut the keys a block reads).
  check_case<ft::bf16>({1, 400, 1, 1, 64}, false);
}

TEST_CASE("cuda_emu sm90 attention forward bf16 head dim 128 against the CPU kernels") {
  if (!sm90_here()) return;
  check_shapes<ft::bf16>({
      {1, 150, 2, 2, 128},  // GQA 1, three key tiles, a tail
      {1, 192, 2, 1, 128},  // GQA 2
      {1, 260, 1, 1, 128},  // both warpgroups over several tiles, a 4-row tail
  });
  check_case<ft::bf16>({1, 400, 1, 1, 128}, false);  // seven key tiles, as above
}

TEST_CASE("cuda_emu sm90 attention forward f16 against the CPU kernels") {
  if (!sm90_here()) return;
  check_shapes<ft::f16>({
      {1, 111, 2, 1, 64},
      {1, 130, 2, 1, 128},
  });
}

// The backward: its dK/dV kernel's blocks own 128 keys (two warpgroups, the second skipping
// each head's first query tile; under the register split at both head dims, a producer
// warpgroup and setmaxnreg), its dQ kernel's 128 query rows (the split at head dim 128), at both
// head dims.
TEST_CASE("cuda_emu sm90 attention backward bf16 against the CPU kernels") {
  if (!sm90_here()) return;
  for (const Shape& s : {Shape{1, 1, 1, 1, 64},      // one token: a gradient of exactly 0 (dS = 0)
                         Shape{1, 200, 2, 1, 64},    // GQA 2, a tail, a key tile past T's block
                         Shape{1, 130, 2, 1, 128}})  // GQA 2, a 2-row tail, two dK/dV blocks
    for (bool segments : {false, true})
      if (!segments || s.T > 1) check_backward_case<ft::bf16>(s, segments);
  // Head dim 128 with each ring stage used thrice (seven tiles: dQ's last block, dK/dV's first).
  check_backward_case<ft::bf16>({1, 400, 1, 1, 128}, false);
}

TEST_CASE("cuda_emu sm90 attention backward f16 against the CPU kernels") {
  if (!sm90_here()) return;
  // Two batch rows: the second row's first query tile reads the first row's last ids and lse, Δ
  // rows of another (batch, head). (Its one-key flag comes from r == 0; make_segments restarts
  // the ids in each row, so the previous row's last id differs anyway and this case cannot tell:
  // the continued ids of the next test case do.)
  check_backward_case<ft::f16>({2, 100, 2, 1, 64}, true);
  check_backward_case<ft::f16>({1, 70, 2, 2, 128}, false);  // GQA 1, two kv heads
}

TEST_CASE("cuda_emu sm90 attention backward bf16 batch rows and GQA 4 against the CPU kernels") {
  if (!sm90_here()) return;
  // Two batch rows without segments: the second row's Q, K, V, lse and Δ at its own offsets.
  check_backward_case<ft::bf16>({2, 70, 2, 1, 64}, false);
  // GQA 4: each dK/dV block sums four query heads per kv head (GQA 2 above sums two).
  check_backward_case<ft::bf16>({1, 130, 4, 1, 64}, false);
  // Ids continuing across rows (the second row starts with the first row's last id, in a
  // one-token document): the second row's first query's one-key flag must come from r == 0, not
  // from the id before it (the first row's last, which the dK/dV kernel's ids box, from i0 − 8,
  // holds there): that query's dq and that key's dk exactly 0.
  check_backward_case<ft::bf16>({2, 70, 2, 1, 64}, make_segments(2, 70, true));
}

TEST_CASE("cuda_emu sm90 attention backward rejects what it cannot run") {
  DeviceBuffer<ft::bf16> x(4096);
  DeviceBuffer<float> lse(64);
  // Head dim 96: only 64 and 128 are instantiated.
  CHECK_THROWS_AS(cu::attention_sm90_backward<ft::bf16>(
                      x.get(), x.get(), x.get(), x.get(), x.get(), lse.get(), x.get(), x.get(),
                      x.get(), nullptr, lse.get(), 1, 2, 1, 1, 96, nullptr),
                  ft::Error);
  // The Δ scratch one float in: TMA reads rows of lse and Δ from 16-byte aligned addresses.
  CHECK_THROWS_AS(cu::attention_sm90_backward<ft::bf16>(
                      x.get(), x.get(), x.get(), x.get(), x.get(), lse.get(), x.get(), x.get(),
                      x.get(), nullptr, lse.get() + 1, 1, 2, 1, 1, 64, nullptr),
                  ft::Error);
}
