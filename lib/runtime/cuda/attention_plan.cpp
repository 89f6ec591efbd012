// The pure half of attention_gemm.h (no CUDA): how attention on tensor cores cuts its work and
// how much scratch that takes. In ft_lib, so `ft plan` and the CPU-only unit tests use it.
#include <algorithm>

#include "core/error.h"
#include "runtime/cuda/attention_gemm.h"

namespace ft::cuda {
namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// S (fp32) and P (the compute dtype; fp32 P overwrites S in place) of one kv head's chunk.
size_t chunk_bytes(int rows, int T, DType dtype, bool backward) {
  const size_t cells = size_t(rows) * size_t(attention_gemm_ld(T));
  // Backward in fp32 keeps P in S and needs a second fp32 buffer for dP; 16-bit keeps P apart
  // and writes dP over S. Forward in fp32 needs S alone.
  const size_t second = dtype == DType::kF32 ? (backward ? 4 : 0) : dtype_size(dtype);
  return cells * (4 + second);
}

}  // namespace

int attention_gemm_ld(int cols) { return int(round_up(size_t(std::max(cols, 1)), 16)); }

AttentionGemmPlan attention_gemm_plan(int T, int K, DType dtype, size_t budget_bytes) {
  FT_CHECK(T >= 0 && K >= 1, "attention_gemm_plan: T=", T, " K=", K);
  AttentionGemmPlan p;
  p.rows = std::clamp(T, 1, 256);
  const auto per_head = [&] { return std::max<size_t>(chunk_bytes(p.rows, T, dtype, true), 1); };
  while (p.rows > 16 && per_head() > budget_bytes) p.rows /= 2;
  p.kv_heads = int(std::clamp<size_t>(budget_bytes / per_head(), 1, size_t(K)));
  return p;
}

size_t attention_gemm_scratch_bytes(int B, int T, int K, int D, DType dtype,
                                    const AttentionGemmPlan& plan, bool backward) {
  // As attention_gemm.cpp carves it: S, then the second buffer, then dK and dV, each rounded
  // up to 256 bytes.
  const size_t cells = size_t(plan.kv_heads) * size_t(plan.rows) * size_t(attention_gemm_ld(T));
  const size_t second = dtype == DType::kF32 ? (backward ? 4 : 0) : dtype_size(dtype);
  size_t bytes = round_up(4 * cells, 256) + round_up(second * cells, 256);
  if (backward && dtype != DType::kF32)  // dK and dV fp32 accumulators (B, T, K, D)
    bytes += 2 * round_up(sizeof(float) * size_t(B) * T * K * D, 256);
  return bytes;
}

}  // namespace ft::cuda
