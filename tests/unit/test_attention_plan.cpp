// lib/runtime/cuda/attention_plan.cpp: how attention on tensor cores chunks its work and what
// scratch that takes (pure logic; the chunks' results are tested in tests/cuda_emu/test_attention).
#include <doctest/doctest.h>

#include "runtime/cuda/attention_gemm.h"
#include "runtime/cuda/attention_plan.h"

using ft::DType;
using namespace ft::cuda;

TEST_CASE("attention_gemm_plan: 256-position chunks, as many slabs as the budget holds") {
  // The 1B bench shape: B = 4, T = 2048, 8 kv heads of 4 query heads, bf16. One slab's chunk is
  // 256·4 rows × 2048 × (4 + 2) B = 12 MiB, so 21 of the 32 slabs fit 256 MiB.
  AttentionGemmPlan p = attention_gemm_plan(4, 2048, 8, 4, DType::kBF16);
  CHECK(p.rows == 256);
  CHECK(p.slabs == 21);
  // Short sequences: one chunk of every position and slab.
  p = attention_gemm_plan(2, 19, 2, 2, DType::kF32);
  CHECK(p.rows == 19);
  CHECK(p.slabs == 4);
  // A tight budget: one slab per GEMM, and rows halve until a chunk fits (or reach 16).
  p = attention_gemm_plan(4, 2048, 8, 4, DType::kBF16, size_t{4} << 20);
  CHECK(p.slabs == 1);
  CHECK(p.rows == 64);  // 64·4 × 2048 × 6 B = 3 MiB <= 4 MiB < 128 positions' 6 MiB
  p = attention_gemm_plan(1, 1 << 20, 8, 4, DType::kBF16, size_t{1} << 20);
  CHECK(p.rows == 16);  // the floor: the budget cannot be met, the chunk stays usable
  CHECK(p.slabs == 1);
}

TEST_CASE("attention scratch: head-major copies, S and P (or dP), the dK/dV sums") {
  const AttentionGemmPlan p{16, 2};
  const int B = 1, T = 19, H = 4, K = 2, D = 8, G = 2, ld = attention_gemm_ld(T);
  CHECK(ld == 32);
  const size_t cells = 2 * 16 * G * 32;  // 2048
  // bf16: q 19·4·8·2 B = 1216 → 1280 (256-byte pieces), k and v 608 → 768, out like q.
  const AttentionScratch f(B, T, H, K, D, DType::kBF16, p, false);
  CHECK(f.k == 1280);
  CHECK(f.s == 1280 + 768 + 768 + 1280);
  CHECK(f.bytes == f.s + 4 * cells + 2 * cells);
  // Backward adds dq like q and fp32 dK, dV (19·2·8·4 = 1216 → 1280 each) before the chunk.
  const AttentionScratch b(B, T, H, K, D, DType::kBF16, p, true);
  CHECK(b.s == 1280 + 768 + 768 + 1280 + 1280 + 1280 + 1280);
  CHECK(b.bytes == b.s + 6 * cells);
  // fp32: P overwrites S in forward; backward keeps dP beside it.
  CHECK(AttentionScratch(B, T, H, K, D, DType::kF32, p, false).second ==
        AttentionScratch(B, T, H, K, D, DType::kF32, p, false).bytes);
  const AttentionScratch b32(B, T, H, K, D, DType::kF32, p, true);
  CHECK(b32.bytes == b32.s + 8 * cells);
  CHECK(attention_gemm_scratch_bytes(B, T, H, K, D, DType::kF32, p, true) == b32.bytes);
}
