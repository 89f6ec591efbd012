// CUDA kernels, host-side entry points: a launcher per op of runtime/op_list.h but the GEMMs
// (cuBLASLt), with the contract of its CPU kernel (kernels/kernels.h), queued on `stream` (a
// cudaStream_t passed as void*, so this header needs no CUDA headers and lib/runtime/cuda/
// can include it from plain C++; cuda_ops.cpp calls them). Pointers are device pointers.
//
// Element types: T in {float, bf16, f16} of core/half.h (2-byte storage structs with the
// same bits as __nv_bfloat16 / __half; the .cu files reinterpret them). fp32 math inside, one
// rounding on store, as the CPU kernels (kernels/cpu/, the reference these are tested against).
//
// Differences from kernels.h, all forced by the device:
//   - Scalars the step needs are accumulated in device memory (`double* acc += ...`), never
//     returned to the host.
//   - Reductions are deterministic: no floating-point atomics. A kernel that reduces across
//     blocks writes per-block partials into caller-provided `scratch` and sums them in a fixed
//     order; `*_scratch_bytes` says how much it needs. The same inputs give the same bits on
//     every run and every schedule (tests vary the emulator's schedule seed).
//
// Built twice from the same sources: by nvcc for the GPU (FT_CUDA), and by g++ against the CUDA
// emulation header (tests/cuda_emu/, FT_CUDA_EMU: a test tool that runs every CUDA thread as a
// fiber on the CPU) so CI executes these kernels without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/half.h"
#include "kernels/adamw_step.h"

namespace ft::kernels::cuda {

// ---- Scratch: what the launchers that reduce across blocks need, by the fixed grids of their
// kernels. Inline arithmetic, so that plain C++ without a GPU asks for exactly what the CUDA ops
// ask for (`ft plan`'s counting device, lib/runtime/cuda/ops_memory.h). ----
// rmsnorm.cu's backward: at most this many blocks, each adding one partial row of C floats.
inline constexpr int kRmsnormBackwardBlocks = 512;
// reduce.cu's sum_squares: blocks of kSumSquaresThreads threads, at least
// kSumSquaresPerThread items each before another block is added (each costs a partial and a
// block reduction), at most kSumSquaresMaxPartials blocks.
inline constexpr unsigned kSumSquaresThreads = 256;
inline constexpr unsigned kSumSquaresPerThread = 8;
inline constexpr unsigned kSumSquaresMaxPartials = 1024;
inline unsigned sum_squares_blocks(size_t n) {
  const size_t per_block = size_t(kSumSquaresThreads) * kSumSquaresPerThread;
  const size_t blocks = (n + per_block - 1) / per_block;
  return unsigned(blocks < 1 ? 1
                             : (blocks > kSumSquaresMaxPartials ? kSumSquaresMaxPartials : blocks));
}
inline size_t rmsnorm_backward_scratch_bytes(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  const int G = N < kRmsnormBackwardBlocks ? N : kRmsnormBackwardBlocks;
  return sizeof(float) * size_t(G) * size_t(C);
}
// One loss per row; ce_finish needs the same.
inline size_t cross_entropy_scratch_bytes(int N, int /*V*/) { return sizeof(double) * size_t(N); }
inline size_t sum_squares_scratch_bytes(size_t n) {
  return n == 0 ? 0 : sizeof(double) * sum_squares_blocks(n);
}
// bias.cu's bias_grad: chunks of at least kBiasRowsPerChunk rows (each costs a partial row of
// C floats), at most kBiasMaxChunks of them.
inline constexpr int kBiasRowsPerChunk = 32;
inline constexpr int kBiasMaxChunks = 256;
inline int bias_grad_chunks(int N) {
  const int chunks = (N + kBiasRowsPerChunk - 1) / kBiasRowsPerChunk;
  return chunks < kBiasMaxChunks ? chunks : kBiasMaxChunks;
}
inline size_t bias_grad_scratch_bytes(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return sizeof(float) * size_t(bias_grad_chunks(N)) * size_t(C);
}
// The attention backward's: Δ (B, H, T) in fp32; dQ is summed in registers (any T, K, D).
template <typename T>
inline size_t attention_backward_scratch_bytes(int B, int T_, int H, int /*K*/, int /*D*/) {
  return sizeof(float) * size_t(B) * size_t(H) * size_t(T_);
}

// ---- bias.cu ----
template <typename T>
void bias_add(T* y, const T* b, int N, int C, void* stream);
// db (C) += Σ over rows: per-chunk partial rows in scratch (bias_grad_scratch_bytes), then
// added in chunk order (no atomics; the bits depend on (N, C) only).
template <typename T>
void bias_grad(float* db, const T* dy, int N, int C, void* scratch, void* stream);

// ---- embedding.cu ----
template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int N, int C, int v_begin,
                       int v_count, void* stream);
// Deterministic: each table row sums its tokens' gradients in token order (no atomics).
template <typename T>
void embedding_backward(float* dtable, const int32_t* ids, const T* dout, int N, int C, int v_begin,
                        int v_count, void* stream);

// ---- rmsnorm.cu ----
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int N, int C, float eps,
                     void* stream);
// dw (C) += Σ over rows, summed in a fixed order (per-block partials in scratch,
// rmsnorm_backward_scratch_bytes). accumulate_dx: dx += instead of dx = (kernels.h); dx must
// not overlap dout or x.
template <typename T>
void rmsnorm_backward(T* dx, float* dw, const T* dout, const T* x, const T* w, const float* rstd,
                      int N, int C, bool accumulate_dx, void* scratch, void* stream);

// ---- rope.cu ---- (pos: (B, T_) int32 positions in device memory, or null for t; kernels.h)
template <typename T>
void rope_forward(T* x, const float* inv_freq, int B, int T_, int nh, int D, void* stream,
                  const int32_t* pos = nullptr);
template <typename T>
void rope_backward(T* dx, const float* inv_freq, int B, int T_, int nh, int D, void* stream,
                   const int32_t* pos = nullptr);

// ---- decode.cu: generation with a KV cache (kernels.h "decode.cpp") ----
// Head dim D <= 256 (ft::Error otherwise: each lane keeps D / 32 outputs in registers).
template <typename T>
void attention_decode(T* out, const T* q, const T* k, const T* v, int pos, int Tq, int H, int K,
                      int D, void* stream);

// ---- attention.cu: causal GQA, logsumexp contract of kernels.h ----
// Head dim D <= 128 (ft::Error otherwise: the kernels keep a row's D outputs in registers).
template <typename T>
void attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, int B, int T_, int H,
                       int K, int D, void* stream);
// Δ (B, H, T) = rowsum(dO ∘ O) per query row, in fp32 (any D).
template <typename T>
void attention_delta(float* delta, const T* dout, const T* out, int B, int T_, int H, int D,
                     void* stream);
// scratch: attention_backward_scratch_bytes.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                        const T* q, const T* k, const T* v, void* scratch, int B, int T_, int H,
                        int K, int D, void* stream);

// ---- attention_fused.cu: causal GQA on tensor cores (FlashAttention-2, sm_80+) ----
// The contract of attention.cu with bf16/f16 only, head dims 64 and 128
// (attention_fused_supported), all tensors 16-byte aligned (ft::Error otherwise), plus optional
// document masking: seg (B, T) int32 segment ids, non-decreasing along T within a sample, or
// nullptr for one document per sample; a query attends to the keys at or before it with its
// own id (the first token of each document gets a zero gradient, as position 0 does).
inline bool attention_fused_supported(int D) { return D == 64 || D == 128; }
template <typename T>
void attention_fused_forward(T* out, float* lse, const T* q, const T* k, const T* v,
                             const int32_t* seg, int B, int T_, int H, int K, int D, void* stream);
// The backward's scratch: Δ (B, H, T) in fp32; dQ, dK and dV are summed in registers.
inline size_t attention_fused_backward_scratch_bytes(int B, int T_, int H) {
  return sizeof(float) * size_t(B) * size_t(H) * size_t(T_);
}
// Deterministic (no float atomics): dK/dV of a kv head sum its query heads in a fixed order.
template <typename T>
void attention_fused_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                              const T* q, const T* k, const T* v, const int32_t* seg, void* scratch,
                              int B, int T_, int H, int K, int D, void* stream);

// ---- attention_sm90.cu: the fused forward for Hopper (TMA, mbarrier, wgmma; sm_90a) ----
// attention_fused_forward's contract and results (within the same tolerances: the same
// formulas, other summation orders). Launch it only where attention_sm90_available() (a device
// of compute capability 9.x: the build's 90a code); elsewhere its kernel has no body.
bool attention_sm90_available();
template <typename T>
void attention_sm90_forward(T* out, float* lse, const T* q, const T* k, const T* v,
                            const int32_t* seg, int B, int T_, int H, int K, int D, void* stream);
// attention_fused_backward's contract (the same scratch: Δ, attention_fused_backward_scratch_bytes;
// deterministic, no float atomics) and results within the same tolerances. Also requires
// B·H·T < 2^31.
template <typename T>
void attention_sm90_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                             const T* q, const T* k, const T* v, const int32_t* seg, void* scratch,
                             int B, int T_, int H, int K, int D, void* stream);

// ---- attention_gemm.cu: the elementwise half of attention on tensor cores ----
// lib/runtime/cuda/attention_gemm.cpp runs attention as cuBLASLt GEMMs on head-major copies:
// q as (B·K slabs, T, G, D) — a slab is one kv head of one batch row with its G query heads,
// so its rows (t, j) are equally spaced — and k, v as (B·K, T, D). A chunk is query positions
// [t0, t0 + rows) of `slabs` slabs: `slabs` matrices of rows·G x cols (row r: query t0 + r / G
// of head j = r % G; cols = t0 + rows keys, those the chunk's queries can see), row stride ld,
// matrix i at i·rows·G·ld. lse and Δ (B, H, T) of slab i, head j, query t:
// stat[(i·G + j)·T + t], with `stat` pointing at the chunk's first slab.
// P = exp(S − lse) for keys s ≤ t, 0 above the diagonal. With compute_lse, lse = logsumexp of
// the row's visible scores is computed first and stored; else it is read. P may be S itself
// when T is float (each element read and written by one thread, after the row's reductions).
template <typename T>
void attention_probs(T* P, float* lse, const float* S, int slabs, int rows, int G, int cols, int ld,
                     int t0, int T_, bool compute_lse, void* stream);
// dS = P ∘ (dP − Δ_t) · scale for s ≤ t, 0 elsewhere and on query 0 (whose softmax is the
// constant 1: exactly zero gradient, as the CPU kernel). In place over P (T), dP fp32.
template <typename T>
void attention_dscores(T* P_dS, const float* dP, const float* delta, int slabs, int rows, int G,
                       int cols, int ld, int t0, int T_, float scale, void* stream);
// dst (A, B2, B1, inner) = src (A, B1, B2, inner) with axes 1 and 2 swapped, converted from Src
// to Dst (one rounding). Dst and Src in {float, bf16, f16}, one of them float or both the same.
template <typename Dst, typename Src>
void swap_axes12(Dst* dst, const Src* src, int A, int B1, int B2, int inner, void* stream);

// ---- swiglu.cu ----
template <typename T>
void swiglu_forward(T* h, const T* g, const T* u, size_t n, void* stream);
template <typename T>
void swiglu_backward(T* dg, T* du, const T* dh, const T* g, const T* u, size_t n, void* stream);

// ---- cross_entropy.cu: *loss_acc += Σ loss over masked rows (fixed-order sum; scratch:
// cross_entropy_scratch_bytes). scale: one fp32 in device memory, read by the kernel (a graph
// replay reads the value then current); null only without dlogits ----
template <typename T>
void cross_entropy(T* dlogits, const T* logits, const int32_t* targets, const uint8_t* mask, int N,
                   int V, const float* scale, double* loss_acc, void* scratch, void* stream);
// Vocabulary-parallel pieces (kernels.h row_max, ce_partial, ce_finish); ce_finish's scratch is
// cross_entropy_scratch_bytes(N, V) too.
template <typename T>
void row_max(float* out, const T* x, int N, int V, void* stream);
template <typename T>
void ce_partial(double* sumexp, double* target_logit, const T* logits, const int32_t* targets,
                const uint8_t* mask, const float* row_max, int N, int V, int v_begin, void* stream);
template <typename T>
void ce_finish(T* dlogits, const T* logits, const int32_t* targets, const uint8_t* mask,
               const float* row_max, const double* sumexp, const double* target_logit, int N, int V,
               int v_begin, const float* scale, double* loss_acc, void* scratch, void* stream);

// ---- convert.cu: the bits of core/half.h's conversions (NaN, inf, subnormals) ----
template <typename Dst, typename Src>
void convert(Dst* dst, const Src* src, size_t n, void* stream);

// ---- dropout.cu: kernels.h dropout_scale, the CPU's bits (kernels/philox.h's mask) ----
// y (rows, cols) = x ∘ mask · f / (1 − p) over columns [col0, col0 + cols); y may be x. key:
// one uint64 in device memory, read by the kernel; null when p = 0.
template <typename T>
void dropout_scale(T* y, const T* x, size_t rows, size_t cols, size_t col0, float p, float f,
                   const uint64_t* key, void* stream);

// ---- nf4.cu: kernels.h quantize_nf4 / dequantize_nf4, the CPU's bits (kernels/nf4.h) ----
// codes (nf4_code_bytes(n)), absmax (nf4_blocks(n)) from x (n).
template <typename T>
void quantize_nf4(uint8_t* codes, float* absmax, const T* x, size_t n, void* stream);
// out (n) from codes, qabsmax (nf4_blocks(n)), scale (nf4_groups(nf4_blocks(n))), mean.
template <typename T>
void dequantize_nf4(T* out, const uint8_t* codes, const int8_t* qabsmax, const float* scale,
                    float mean, size_t n, void* stream);

// ---- random.cu: kernels.h random_normal, the CPU's bits (kernels/philox.h) ----
// out (rows, cols) = the 2-D form: element first + r·ld + c of the tensor at [r·cols + c].
void random_normal(float* out, size_t rows, size_t cols, size_t ld, uint64_t key, uint64_t first,
                   double std, void* stream);

// ---- reduce.cu ----
template <typename T>
void add_inplace(T* y, const T* x, size_t n, void* stream);
void scale_inplace(float* y, float s, size_t n, void* stream);
// *acc += Σ x² / divisor in double, summed in a fixed order (scratch: sum_squares_scratch_bytes).
void sum_squares(double* acc, const float* x, size_t n, double divisor, void* scratch,
                 void* stream);

// ---- adamw.cu: kernels.h adamw_update (to rounding: where nvcc contracts into FMAs the bits
// may differ from the CPU's); args (the step's constants and grad_scale) in device memory, read
// when the kernel runs; p_compute (T) may be null ----
template <typename T>
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamwArgs* args,
                  T* p_compute, void* stream);

}  // namespace ft::kernels::cuda
