// Causal grouped-query attention on tensor cores: the score and value products as cuBLASLt
// strided-batched GEMMs (lt_gemm.h), the softmax and its gradient as the row kernels of
// kernels/cuda/attention_gemm.cu. The same contract as kernels.h attention_forward/backward
// (layouts q, out (B, T, H, D); k, v (B, T, K, D); lse (B, H, T)), for any head dim.
//
// Layout for the GEMMs: q, k and v are first copied head-major, into B·K "slabs" (one kv head
// of one batch row): q as (B·K, T, G, D), k and v as (B·K, T, D). In a slab the G query heads
// sharing the kv head are rows (t, j) of one (T·G, D) matrix, and slabs are equally spaced, so
// one strided-batched GEMM covers every head of every batch row: GQA needs no copy of K or V per
// query head, and a step makes a few large GEMMs, not one per head. out and the gradients come
// back through the inverse copy (dK, dV summed in fp32 over a group's heads and the chunks).
// The copies move q, k, v, out and their gradients once more each: memory-bound work of a few
// percent of attention's, in exchange for GEMMs large enough for the tensor cores.
//
// Transient memory is bounded, never (B, H, T, T): query positions go in chunks of `rows`, and
// a chunk ending at t1 multiplies only keys [0, t1) (causality: later keys are masked), which
// also skips most of the masked half of QKᵀ (with 256-row chunks at T = 2048, 12.5% more than
// the causal triangle is computed instead of 100%). A GEMM covers `slabs` slabs; per chunk the
// scratch holds S (fp32, slabs·rows·G·ld) and P (compute dtype, or S itself in fp32).
//
// Numerics differ from the SIMT twin (attention.cu) in one place: P is rounded to the compute
// dtype before the P·V and Pᵀ·dO products (tensor cores multiply 16-bit inputs), and dS = P ∘
// (dP − Δ) uses that rounded P and is rounded before dS·K and dSᵀ·Q; fp32 stays fp32 throughout.
// Deterministic: fixed loop order, fp32 accumulation in cuBLASLt's fixed algorithm (lt_gemm.h),
// fixed-order row reductions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "runtime/cuda/lt_gemm.h"

namespace ft::cuda {

// How attention_gemm_* cuts the work: `rows` query positions per chunk, `slabs` slabs (kv head
// × batch row) per GEMM.
struct AttentionGemmPlan {
  int rows = 0;
  int slabs = 0;
};

// Default chunking under a budget for S and P: rows = min(T, 256); as many slabs (up to B·K)
// as fit `budget_bytes`; at one slab, rows halve (down to 16) until it fits. Pure.
AttentionGemmPlan attention_gemm_plan(int B, int T, int K, int G, DType dtype,
                                      size_t budget_bytes = size_t{256} << 20);

// Row stride of the score chunks: the key count rounded up to 16 elements (32 bytes of bf16),
// so every row of S and P starts aligned for the tensor-core GEMMs.
int attention_gemm_ld(int cols);

// Scratch bytes attention_gemm_forward / _backward need with `plan` (head-major copies, the
// chunk's S and P, and in backward the fp32 dK, dV sums).
size_t attention_gemm_scratch_bytes(int B, int T, int H, int K, int D, DType dtype,
                                    const AttentionGemmPlan& plan, bool backward);

void attention_gemm_forward(LtGemm& lt, DType dtype, void* out, float* lse, const void* q,
                            const void* k, const void* v, int B, int T, int H, int K, int D,
                            const AttentionGemmPlan& plan, void* scratch, void* stream);

// `delta`: B·H·T floats for Δ = rowsum(dO ∘ O) (the Ops contract's backward scratch).
void attention_gemm_backward(LtGemm& lt, DType dtype, void* dq, void* dk, void* dv,
                             const void* dout, const void* out, const float* lse, const void* q,
                             const void* k, const void* v, float* delta, int B, int T, int H, int K,
                             int D, const AttentionGemmPlan& plan, void* scratch, void* stream);

}  // namespace ft::cuda
