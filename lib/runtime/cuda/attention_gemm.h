// Causal grouped-query attention on tensor cores: the score and value products as cuBLASLt
// strided-batched GEMMs (lt_gemm.h), the softmax and its gradient as the row kernels of
// kernels/cuda/attention_gemm.cu. The same contract as kernels.h attention_forward/backward
// (layouts q, out (B, T, H, D); k, v (B, T, K, D); lse (B, H, T)), for any head dim.
//
// Transient memory is bounded, never (B, H, T, T): query rows go in chunks of `rows`, and a
// chunk of r query rows ending at r1 multiplies only keys [0, r1) (causality: later keys are
// masked), which also skips most of the masked half of QKᵀ (with 256-row chunks at T = 2048,
// 12.5% more than the causal triangle is computed instead of 100%). One GEMM covers `kv_heads`
// kv heads at once, for one batch row b and one query head j of each kv head's group (query
// head g·G + j): the heads of a batch are then equally spaced in memory (q and out by G·D
// elements, k and v by D), as a strided batch needs. Per chunk the scratch holds S (fp32,
// kv_heads·rows·ld) and P (compute dtype, or S itself in fp32); backward adds dK and dV fp32
// accumulators (B, T, K, D) for 16-bit dtypes.
//
// Numerics differ from the SIMT twin (attention.cu) in one place: P is rounded to the compute
// dtype before the P·V and Pᵀ·dO products (tensor cores multiply 16-bit inputs), and dS = P ∘
// (dP − Δ) uses that rounded P; both fp32 in fp32. Deterministic: fixed loop order, fp32
// accumulation in cuBLASLt's fixed algorithm (lt_gemm.h), fixed-order row reductions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "runtime/cuda/lt_gemm.h"

namespace ft::cuda {

// How attention_gemm_* cuts the work: `rows` query rows per chunk, `kv_heads` kv heads per GEMM.
struct AttentionGemmPlan {
  int rows = 0;
  int kv_heads = 0;
};

// Default chunking under a scratch budget: rows = min(T, 256); as many kv heads (up to K) as
// fit `budget_bytes` of S and P; at one head, rows halve (down to 16) until they fit. Pure.
AttentionGemmPlan attention_gemm_plan(int T, int K, DType dtype,
                                      size_t budget_bytes = size_t{128} << 20);

// Row stride of the score chunks: the key count rounded up to 16 elements (32 bytes of bf16),
// so every row of S and P starts aligned for the tensor-core GEMMs.
int attention_gemm_ld(int cols);

// Scratch bytes attention_gemm_forward / _backward need with `plan`.
size_t attention_gemm_scratch_bytes(int B, int T, int K, int D, DType dtype,
                                    const AttentionGemmPlan& plan, bool backward);

void attention_gemm_forward(LtGemm& lt, DType dtype, void* out, float* lse, const void* q,
                            const void* k, const void* v, int B, int T, int H, int K, int D,
                            const AttentionGemmPlan& plan, void* scratch, void* stream);

// `delta`: B·H·T floats for Δ = rowsum(dO ∘ O) (the Ops contract's backward scratch).
void attention_gemm_backward(LtGemm& lt, DType dtype, void* dq, void* dk, void* dv,
                             const void* dout, const void* out, const float* lse, const void* q,
                             const void* k, const void* v, float* delta, int B, int T, int H,
                             int K, int D, const AttentionGemmPlan& plan, void* scratch,
                             void* stream);

}  // namespace ft::cuda
