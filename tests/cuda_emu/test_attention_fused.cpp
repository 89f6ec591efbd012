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

#include <string>
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
using ft::cuda_test::attention::FusedCase;
using ft::cuda_test::attention::make_segments;
using ft::cuda_test::attention::Shape;
using ft::emu::test::DeviceBuffer;

template <typename E>
void check_case(const Shape& s, bool with_segments) {
  const FusedCase<E> c(s, with_segments ? make_segments(s.B, s.T) : std::vector<int32_t>{});
  check_forward_backward<E>(c.where("fused"), c, cu::attention_fused_forward<E>,
                            cu::attention_fused_backward<E>);
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
