// lib/runtime/cuda/attention_plan.cpp: how attention on tensor cores chunks its work and what
// scratch that takes (pure logic; the chunks' results are tested in tests/cuda_emu/test_attention).
#include <doctest/doctest.h>

#include "runtime/cuda/attention_gemm.h"

using ft::DType;
using namespace ft::cuda;

TEST_CASE("attention_gemm_plan: 256-row chunks, as many kv heads as the budget holds") {
  // The 1B bench shape: T = 2048, 8 kv heads, bf16. One head's chunk is 256 × 2048 × (4 + 2) B
  // = 3 MiB, so all 8 heads fit 128 MiB.
  AttentionGemmPlan p = attention_gemm_plan(2048, 8, DType::kBF16);
  CHECK(p.rows == 256);
  CHECK(p.kv_heads == 8);
  // Short sequences: one chunk of all rows.
  p = attention_gemm_plan(19, 2, DType::kF32);
  CHECK(p.rows == 19);
  CHECK(p.kv_heads == 2);
  // A tight budget: one head per GEMM, and rows halve until a chunk fits (or reach 16).
  p = attention_gemm_plan(2048, 8, DType::kBF16, size_t{1} << 20);
  CHECK(p.kv_heads == 1);
  CHECK(p.rows == 64);  // 64 × 2048 × 6 B = 768 KiB <= 1 MiB < 128 rows' 1.5 MiB
  p = attention_gemm_plan(1 << 20, 8, DType::kBF16, size_t{1} << 20);
  CHECK(p.rows == 16);  // the floor: the budget cannot be met, the chunk stays usable
  CHECK(p.kv_heads == 1);
}

TEST_CASE("attention_gemm_scratch_bytes: S, P (or dP) and the dK/dV accumulators") {
  const AttentionGemmPlan p{16, 2};
  const int T = 19, ld = attention_gemm_ld(T);
  CHECK(ld == 32);
  const size_t cells = 2 * 16 * 32;  // 1024
  // fp32 forward: P overwrites S.
  CHECK(attention_gemm_scratch_bytes(1, T, 2, 8, DType::kF32, p, false) == 4 * cells);
  // fp32 backward: S (P in place) and dP.
  CHECK(attention_gemm_scratch_bytes(1, T, 2, 8, DType::kF32, p, true) == 8 * cells);
  // bf16 forward: S and P; backward adds dK, dV (B·T·K·D fp32 each, rounded up to 256 B).
  CHECK(attention_gemm_scratch_bytes(1, T, 2, 8, DType::kBF16, p, false) == 6 * cells);
  CHECK(attention_gemm_scratch_bytes(1, T, 2, 8, DType::kBF16, p, true) ==
        6 * cells + 2 * 1280);  // 19·2·8·4 = 1216 → 1280
}
