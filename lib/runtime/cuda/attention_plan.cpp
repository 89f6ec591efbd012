// The pure half of attention_gemm.h (no CUDA): how attention on tensor cores cuts its work and
// how much scratch that takes. In ft_lib, so `ft plan` and the CPU-only unit tests use it;
// attention_gemm.cpp carves its scratch with the same AttentionScratch.
#include "runtime/cuda/attention_plan.h"

#include <algorithm>

#include "core/error.h"

namespace ft::cuda {
namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Bytes per score cell of a chunk: S in fp32, and beside it P (16-bit), or dP (fp32 backward:
// P overwrites S there), or nothing (fp32 forward).
size_t cell_bytes(DType dtype, bool backward) {
  return 4 + (dtype == DType::kF32 ? (backward ? 4 : 0) : dtype_size(dtype));
}

}  // namespace

int attention_gemm_ld(int cols) { return int(round_up(size_t(std::max(cols, 1)), 16)); }

AttentionGemmPlan attention_gemm_plan(int B, int T, int K, int G, DType dtype,
                                      size_t budget_bytes) {
  FT_CHECK(B >= 0 && T >= 0 && K >= 1 && G >= 1, "attention_gemm_plan: B=", B, " T=", T, " K=", K,
           " G=", G);
  AttentionGemmPlan p;
  p.rows = std::clamp(T, 1, 256);
  const auto per_slab = [&] {
    return std::max<size_t>(size_t(p.rows) * G * attention_gemm_ld(T) * cell_bytes(dtype, true), 1);
  };
  while (p.rows > 16 && per_slab() > budget_bytes) p.rows /= 2;
  const size_t slabs = std::max<size_t>(size_t(B) * K, 1);
  p.slabs = int(std::clamp<size_t>(budget_bytes / per_slab(), 1, std::min<size_t>(slabs, 65535)));
  return p;
}

AttentionScratch::AttentionScratch(int B, int T, int H, int K, int D, DType dtype,
                                   const AttentionGemmPlan& plan, bool backward) {
  const size_t eb = dtype_size(dtype), nq = size_t(B) * T * H * D, nkv = size_t(B) * T * K * D;
  const size_t cells =
      size_t(plan.slabs) * plan.rows * (H / std::max(K, 1)) * size_t(attention_gemm_ld(T));
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at += round_up(bytes, 256);
    return here;
  };
  q = take(nq * eb);
  k = take(nkv * eb);
  v = take(nkv * eb);
  o_or_do = take(nq * eb);  // forward: out head-major; backward: dO head-major
  if (backward) {
    dq = take(nq * eb);
    dk = take(nkv * 4);
    dv = take(nkv * 4);
  }
  s = take(cells * 4);
  second = take(cells * (cell_bytes(dtype, backward) - 4));
  bytes = at;
}

size_t attention_gemm_scratch_bytes(int B, int T, int H, int K, int D, DType dtype,
                                    const AttentionGemmPlan& plan, bool backward) {
  return AttentionScratch(B, T, H, K, D, dtype, plan, backward).bytes;
}

}  // namespace ft::cuda
