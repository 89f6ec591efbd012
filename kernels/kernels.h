// Compute kernels. Raw pointers, sizes and (later) a stream; no tensors, recipes or
// communicators. Every op exists once per backend with the same contract; the CPU versions in
// kernels/cpu/ are the reference that other backends are tested against.
//
// Shape letters: B batch, T sequence, C model dim, H query heads, K kv heads, D head dim,
// F ffn dim, V vocab, N = B*T rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/half.h"

namespace ft::kernels {

// ---- GEMM (BLAS) -----------------------------------------------------------------------------
// C(M,N) = alpha * op(A) · op(B) + beta * C, row-major, leading dimensions in elements.
void gemm_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
              int lda, const float* B, int ldb, float beta, float* C, int ldc);

// Linear layer y = x · Wᵀ with W (out, in) row-major (the HF layout), T in {float, bf16, f16}.
// x (N, in), y (N, out). accumulate: y += instead of y =. Products are summed in fp32 and y is
// rounded to T once (after the += when accumulating).
// float: OpenBLAS sgemm (gemm.cpp), the reference. bf16, f16: oneDNN matmul (gemm_onednn.cpp).
template <typename T>
void linear_forward(T* y, const T* x, const T* W, int N, int in, int out,
                    bool accumulate = false);
// dx (N, in) (+)= dy · W, in T; dW (out, in) += dyᵀ · x, always fp32 (gradients are fp32 in
// every precision). Either output may be null to skip it.
template <typename T>
void linear_backward(T* dx, float* dW, const T* dy, const T* x, const T* W, int N, int in,
                     int out, bool accumulate_dx = false);
template <>
void linear_forward<float>(float* y, const float* x, const float* W, int N, int in, int out,
                           bool accumulate);
template <>
void linear_backward<float>(float* dx, float* dW, const float* dy, const float* x,
                            const float* W, int N, int in, int out, bool accumulate_dx);

// ---- Embedding -------------------------------------------------------------------------------
// out (N, C) = table[ids[n] − v_begin] for ids in [v_begin, v_begin + v_count), zero rows for
// other ids (a vocabulary-parallel shard of the table; v_count < 0: the whole table).
void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                       int v_begin = 0, int v_count = -1);
// dtable[ids[n] − v_begin] += dout[n] for ids in the shard (rows in order: duplicate ids
// accumulate deterministically)
void embedding_backward(float* dtable, const int32_t* ids, const float* dout, int N, int C,
                        int v_begin = 0, int v_count = -1);

// ---- RMSNorm (HF: x * rsqrt(mean(x²) + eps) * w) ----------------------------------------------
// out (N, C); rstd (N) saved for backward.
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N, int C,
                     float eps);
// dx (N, C) = ...; dw (C) += ... (accumulated)
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int N, int C);

// ---- RoPE, rotate-half pairing (i with i + D/2) ----------------------------------------------
// x (B, T, nh, D) rotated in place; position of (b, t) is t. Pair (i, i + D/2) turns by the
// angle float(t) · inv_freq[i]; inv_freq (D/2) carries the rope type's scaling (lib/model/rope.h
// computes it; theta^(-2i/D) without scaling).
void rope_forward(float* x, const float* inv_freq, int B, int T, int nh, int D);
// Inverse rotation, in place, applied to the gradient.
void rope_backward(float* dx, const float* inv_freq, int B, int T, int nh, int D);

// ---- Causal grouped-query attention ----------------------------------------------------------
// q (B, T, H, D), k and v (B, T, K, D), with H a multiple of K (query head h uses kv head h/(H/K)).
// out (B, T, H, D); probs (B, H, T, T) saved softmax (upper triangle zero).
void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v,
                       int B, int T, int H, int K, int D);
// Gradients of q, k, v (overwritten). scratch: B*H*T*T floats.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs,
                        const float* q, const float* k, const float* v, float* scratch, int B,
                        int T, int H, int K, int D);

// ---- SwiGLU: h = silu(g) * u --------------------------------------------------------------------
void swiglu_forward(float* h, const float* g, const float* u, size_t n);
// dg, du from dh (overwritten)
void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     size_t n);

// ---- Cross-entropy over the vocabulary -------------------------------------------------------
// logits (N, V). For each row with mask[n] != 0: loss_n = logsumexp(logits_n) - logits_n[t_n].
// Returns the *sum* of loss_n over masked rows (double, for accurate token-weighted means).
// If dlogits is non-null, writes dlogits = scale * (softmax - onehot) on masked rows, 0 elsewhere
// (dlogits may alias logits).
double cross_entropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets,
                                      const uint8_t* mask, int N, int V, float scale);

// ---- Vocabulary-parallel cross-entropy (Megatron-LM): each tensor rank holds logits for
// columns [v_begin, v_begin + V) of the vocabulary. The caller all-reduces between the steps:
//   1. row_max (N) of local logits → all-reduce max;
//   2. ce_partial: sumexp (N) = Σ exp(l − max) and target_logit (N) (0 off this shard) →
//      all-reduce sum of both;
//   3. ce_finish: loss sum over masked rows (the same on every rank) and this shard's dlogits.
void row_max(float* out, const float* x, int N, int V);
void ce_partial(double* sumexp, double* target_logit, const float* logits, const int32_t* targets,
                const uint8_t* mask, const float* row_max, int N, int V, int v_begin);
double ce_finish(float* dlogits, const float* logits, const int32_t* targets, const uint8_t* mask,
                 const float* row_max, const double* sumexp, const double* target_logit, int N,
                 int V, int v_begin, float scale);

// ---- Elementwise / reductions ----------------------------------------------------------------
void add_inplace(float* y, const float* x, size_t n);  // y += x
void scale_inplace(float* y, float s, size_t n);       // y *= s
double sum_squares(const float* x, size_t n);          // Σ x² in double

// ---- AdamW (torch.optim.AdamW semantics) -----------------------------------------------------
// p ← p(1 − lr·wd); m ← β1 m + (1−β1) g; v ← β2 v + (1−β2) g²;
// p ← p − lr · (m / bc1) / (sqrt(v / bc2) + eps), bc1 = 1 − β1^t, bc2 = 1 − β2^t.
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t t);

}  // namespace ft::kernels

namespace ft::kernels {
// BLAS thread count (OpenBLAS keeps its own pool). Kernels that run many small GEMMs in an
// OpenMP loop set it to 1 for the loop's duration and restore it.
int blas_threads();
// The name of the BLAS kernel set in use (e.g. "SkylakeX").
const char* blas_kernel_name();
// When the BLAS fell back to generic kernels on a CPU it does not recognise, the OPENBLAS_CORETYPE
// value that fits this CPU; nullptr when the choice is already right. OpenBLAS reads that
// variable only when it loads, so the caller sets it and re-executes the process.
const char* blas_better_coretype();
void set_blas_threads(int n);
// The instruction set oneDNN dispatches its bf16/f16 GEMMs to on this CPU (e.g.
// "avx512_core_amx", "avx512_core_bf16", "avx2"; ONEDNN_MAX_CPU_ISA caps it).
const char* gemm_isa();
}  // namespace ft::kernels
