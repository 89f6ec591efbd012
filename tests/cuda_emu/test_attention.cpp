// Both CUDA attention paths, run by the CUDA emulator (a test tool: every CUDA thread a fiber on
// the CPU, cuBLASLt a naive GEMM reading its descriptors; nothing here says anything about GPU
// speed), against the CPU kernels of kernels/cpu/attention.cpp:
//   - SIMT: kernels/cuda/attention.cu (FlashAttention on CUDA cores, head dim <= 128);
//   - tensor cores: lib/runtime/cuda/attention_gemm (cuBLASLt batched GEMMs over head-major
//     slabs with the row kernels of kernels/cuda/attention_gemm.cu), with its default chunking
//     (every slab in one GEMM) and with 7-position chunks of 4 slabs (6 = 4 + 2) or one.
// Odd sequence lengths (1, 19, 111: across the 16-row query tiles, the 8-row dQ tiles and the
// 32-key tiles), head dims 16, 40, 64 and 128, GQA ratios 1, 2 and 4, fp32, bf16 and f16. Each
// dtype's inputs are rounded to it once, so both sides read the same values. The CUDA side runs
// under two schedule seeds and must give the same bits under both (determinism: no float
// atomics, fixed reduction orders). Built natively (ft_cuda_kernel_tests) the same cases run on
// a GPU with the real cuBLASLt.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "lib/core/error.h"
#include "runtime/cuda/attention_gemm.h"
#include "tests/cuda_emu/attention_test_util.h"
#include "tests/cuda_emu/emu_test_util.h"

namespace k = ft::kernels;
namespace cu = ft::kernels::cuda;

namespace {

using ft::cuda_test::attention::random_tensor;
using ft::cuda_test::attention::Result;
using ft::cuda_test::attention::Shape;
using ft::emu::test::DeviceBuffer;

// Tolerances, as (rtol, atol as a fraction of the tensor's max |ref|).
// fp32: both sides compute in fp32 and differ only in the order of the sums (the CPU's tile
// GEMMs vs one running sum per thread) and in exp (the CPU's polynomial is within 1 ulp): a few
// ulp per element, and where dQ/dK cancel, a few ulp of the tensor's largest terms (the largest
// error seen was a fifth of 4e-6).
// bf16 / f16: those fp32 values rounded once; a few fp32 ulp can land on either side of a
// rounding boundary: one ulp of the type, up to 2^-7 (bf16) or 2^-10 (f16) of the value, and
// twice that where the value sits just below a power of two and the other side rounds up to it.
template <typename E>
constexpr double kRtol = std::is_same_v<E, float>      ? 4e-6
                         : std::is_same_v<E, ft::bf16> ? 2.0 / 128
                                                       : 2.0 / 1024;
constexpr double kAtolFrac = 4e-6;
// On tensor cores the 16-bit path also rounds P (before P·V and Pᵀ·dO) and dS (before dS·K and
// dSᵀ·Q) to E, as tensor-core attention does: each product term then carries up to one more
// rounding of E, and a gradient that cancels (dQ, dK sum terms of both signs) keeps that
// error at the scale of its largest terms. So the bound adds two units of E's rounding of the
// tensor's largest value. fp32 keeps every value in fp32: only the sum orders differ.
template <typename E>
constexpr double kGemmAtolFrac = std::is_same_v<E, float>      ? 4e-6
                                 : std::is_same_v<E, ft::bf16> ? 2.0 / 256
                                                               : 2.0 / 2048;

enum class Path { kSimt, kGemm, kGemmSmallChunks };

const char* path_name(Path p) {
  switch (p) {
    case Path::kSimt:
      return "simt ";
    case Path::kGemm:
      return "tensor-core ";
    case Path::kGemmSmallChunks:
      return "tensor-core (7-position chunks, 1 or 4 slabs a GEMM) ";
  }
  return "?";
}

template <typename E>
constexpr ft::DType dtype_of() {
  if constexpr (std::is_same_v<E, float>) return ft::DType::kF32;
  if constexpr (std::is_same_v<E, ft::bf16>) return ft::DType::kBF16;
  return ft::DType::kF16;
}

template <typename E>
void check_shape(const Shape& s, Path path) {
  const auto [B, T, H, K, D] = s;
  const size_t nq = size_t(B) * T * H * D, nk = size_t(B) * T * K * D, nl = size_t(B) * H * T;
  // Scores of a few units: softmax rows neither uniform nor one-hot.
  const auto q = random_tensor<E>(nq, 1, 1.5f), kk = random_tensor<E>(nk, 2, 1.5f);
  const auto v = random_tensor<E>(nk, 3, 1.0f), dout = random_tensor<E>(nq, 4, 1.0f);

  // The reference: the CPU kernels.
  Result<E> ref{std::vector<E>(nq), std::vector<E>(nq), std::vector<E>(nk), std::vector<E>(nk),
                std::vector<float>(nl)};
  std::vector<float> scratch(k::attention_backward_scratch_elems<E>(B, T, H, D));
  k::attention_forward<E>(ref.out.data(), ref.lse.data(), q.data(), kk.data(), v.data(), B, T, H, K,
                          D);
  k::attention_backward<E>(ref.dq.data(), ref.dk.data(), ref.dv.data(), dout.data(), ref.out.data(),
                           ref.lse.data(), q.data(), kk.data(), v.data(), scratch.data(), B, T, H,
                           K, D);

  // The CUDA kernels; the backward reads the CPU's out and lse, so each kernel is compared on
  // the same inputs.
  const DeviceBuffer<E> q_d(q), k_d(kk), v_d(v), dout_d(dout), out_ref_d(ref.out);
  const DeviceBuffer<float> lse_ref_d(ref.lse);
  auto launch = [&](E* o, float* l, E* gq, E* gk, E* gv) {
    if (path == Path::kSimt) {
      cu::attention_forward<E>(o, l, q_d.get(), k_d.get(), v_d.get(), B, T, H, K, D, nullptr);
      const size_t bytes = cu::attention_backward_scratch_bytes<E>(B, T, H, K, D);
      DeviceBuffer<unsigned char> scratch_d(bytes);
      cu::attention_backward<E>(gq, gk, gv, dout_d.get(), out_ref_d.get(), lse_ref_d.get(),
                                q_d.get(), k_d.get(), v_d.get(), scratch_d.get(), B, T, H, K, D,
                                nullptr);
    } else {
      const ft::DType dt = dtype_of<E>();
      ft::cuda::AttentionGemmPlan plan = ft::cuda::attention_gemm_plan(B, T, K, H / K, dt);
      // Chunks of 7 positions; 4 slabs a GEMM where there are more (the last batch is short),
      // else one.
      if (path == Path::kGemmSmallChunks) plan = {7, B * K > 4 ? 4 : 1};
      ft::cuda::LtGemm lt(nullptr, 0, /*allow_tf32=*/false);
      DeviceBuffer<unsigned char> fwd(
          ft::cuda::attention_gemm_scratch_bytes(B, T, H, K, D, dt, plan, false));
      ft::cuda::attention_gemm_forward(lt, dt, o, l, q_d.get(), k_d.get(), v_d.get(), B, T, H, K, D,
                                       plan, fwd.get(), nullptr);
      DeviceBuffer<unsigned char> bwd(
          ft::cuda::attention_gemm_scratch_bytes(B, T, H, K, D, dt, plan, true));
      DeviceBuffer<float> delta(nl);
      ft::cuda::attention_gemm_backward(lt, dt, gq, gk, gv, dout_d.get(), out_ref_d.get(),
                                        lse_ref_d.get(), q_d.get(), k_d.get(), v_d.get(),
                                        delta.get(), B, T, H, K, D, plan, bwd.get(), nullptr);
    }
  };
  const auto [a, b] = ft::cuda_test::attention::run_under_two_seeds<E>(s, launch);

  const std::string where = path_name(path) + ft::cuda_test::attention::shape_text(s) + " ";
  const double atol = path == Path::kSimt ? kAtolFrac : kGemmAtolFrac<E>;
  // lse is fp32 for every E, from the same fp32 scores: a few ulp of a value of a few units.
  ft::cuda_test::attention::expect_matches<E>(where, a, b, ref, kRtol<E>, atol, 1e-5, 1e-6);
}

// Small shapes (the emulator switches fibers at every barrier and shuffle), covering: one token;
// T = 19 inside one key tile; T = 111 across 7 query tiles and 4 key tiles; each GQA ratio;
// D below a warp (16), not a multiple of 32 (40), 64 and the maximum 128.
const Shape kShapes[] = {
    {1, 1, 1, 1, 16},   {2, 19, 2, 1, 40},  {1, 19, 4, 2, 128},
    {1, 111, 2, 2, 64}, {1, 111, 4, 1, 16}, {3, 19, 4, 2, 16},
};

template <typename E>
void check_all_shapes(Path path) {
  for (const Shape& s : kShapes) check_shape<E>(s, path);
}

}  // namespace

TEST_CASE("cuda_emu attention fp32 against the CPU kernels") {
  for (Path p : {Path::kSimt, Path::kGemm, Path::kGemmSmallChunks}) check_all_shapes<float>(p);
}
TEST_CASE("cuda_emu attention bf16 against the CPU kernels") {
  for (Path p : {Path::kSimt, Path::kGemm, Path::kGemmSmallChunks}) check_all_shapes<ft::bf16>(p);
}
TEST_CASE("cuda_emu attention f16 against the CPU kernels") {
  for (Path p : {Path::kSimt, Path::kGemm, Path::kGemmSmallChunks}) check_all_shapes<ft::f16>(p);
}

TEST_CASE("cuda_emu attention rejects shapes it cannot run") {
  std::vector<float> x(4096), lse(64);
  // D above 128: the kernel keeps at most four output dims per lane.
  CHECK_THROWS_AS(cu::attention_forward<float>(x.data(), lse.data(), x.data(), x.data(), x.data(),
                                               1, 2, 1, 1, 129, nullptr),
                  ft::Error);
  // H not a multiple of K: no kv head for some query heads.
  CHECK_THROWS_AS(cu::attention_backward<float>(x.data(), x.data(), x.data(), x.data(), x.data(),
                                                lse.data(), x.data(), x.data(), x.data(),
                                                lse.data(), 1, 2, 3, 2, 16, nullptr),
                  ft::Error);
}

// swap_axes12, the head-major copy of attention on tensor cores: against a host loop, with
// rows of whole 16-byte packs (the pack path), rows that are not (inner 6: the scalar path),
// a view one element in (misaligned: scalar), and the fp32 -> bf16 conversion of dK and dV.
TEST_CASE("cuda_emu swap_axes12 against a host loop, packed and scalar") {
  const int A = 2, B1 = 3, B2 = 5;
  for (int inner : {6, 8, 16})
    for (size_t offset : {size_t(0), size_t(1)}) {
      CAPTURE(inner);
      CAPTURE(offset);
      const size_t n = size_t(A) * B1 * B2 * inner;
      const auto src = random_tensor<float>(n + offset, 7, 1.0f);
      std::vector<float> want(n);
      for (int a = 0; a < A; ++a)
        for (int b1 = 0; b1 < B1; ++b1)
          for (int b2 = 0; b2 < B2; ++b2)
            for (int i = 0; i < inner; ++i)
              want[((size_t(a) * B2 + b2) * B1 + b1) * inner + i] =
                  src[offset + ((size_t(a) * B1 + b1) * B2 + b2) * inner + i];
      const DeviceBuffer<float> src_d(src);
      DeviceBuffer<float> out32(n + offset);
      DeviceBuffer<ft::bf16> out16(n);
      cu::swap_axes12(out32.get() + offset, src_d.get() + offset, A, B1, B2, inner, nullptr);
      cu::swap_axes12(out16.get(), src_d.get() + offset, A, B1, B2, inner, nullptr);
      const std::vector<float> got32 = out32.to_host();
      CHECK(std::memcmp(got32.data() + offset, want.data(), n * sizeof(float)) == 0);
      const std::vector<ft::bf16> got16 = out16.to_host();
      size_t bad = 0;
      for (size_t e = 0; e < n; ++e) bad += got16[e].bits != ft::to_bf16(want[e]).bits;
      CHECK(bad == 0);
    }
}
