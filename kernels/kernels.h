// The CPU backend's compute kernels (kernels/cpu/). Raw host pointers and sizes; no stream:
// each returns when its work is done (threads from OpenMP). No tensors, recipes or
// communicators. Every op of runtime/op_list.h exists once per backend with the same contract;
// these are the reference that the other backends are tested against (kernels/cuda/'s
// launchers are in kernels/cuda/kernels_cuda.h; tests/ops/ checks every Device's ops).
//
// Shape letters: B batch, T sequence, C model dim, H query heads, K kv heads, D head dim,
// F ffn dim, V vocab, N = B*T rows.
//
// Element types: ops marked "T" are templates over T in {float, bf16, f16} (core/half.h),
// instantiated for those three. They load T, compute in fp32 (or double where noted) and round
// once on store; the float instantiation is the fp32 reference the others are tested against.
// Statistics (rstd, row max, sums, the loss) and gradients of parameters stay fp32 or wider.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/half.h"
#include "kernels/adamw_step.h"

namespace ft::kernels {

// ---- GEMM (BLAS) -----------------------------------------------------------------------------
// C(M,N) = alpha * op(A) · op(B) + beta * C, row-major, leading dimensions in elements.
void gemm_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc);

// Linear layer y = x · Wᵀ with W (out, in) row-major (the HF layout), T in {float, bf16, f16}.
// x (N, in), y (N, out). accumulate: y += instead of y =. Products are summed in fp32 and y is
// rounded to T once (after the += when accumulating).
// float: OpenBLAS sgemm (gemm.cpp), the reference. bf16, f16: oneDNN matmul (gemm_onednn.cpp).
template <typename T>
void linear_forward(T* y, const T* x, const T* W, int N, int in, int out, bool accumulate = false);
// y (N, out) = r (N, out) + x · Wᵀ: r copied into y (unless r is y), then linear_forward with
// accumulate, so the same bits (gemm.cpp). Every CPU path adds the old output in place (OpenBLAS's
// beta, oneDNN's sum post-op, the packed kernel's first load), so the copy stays. r is y or
// disjoint from it.
template <typename T>
void linear_forward_residual(T* y, const T* r, const T* x, const T* W, int N, int in, int out);
// dx (N, in) (+)= dy · W, in T; dW (out, in) += dyᵀ · x, always fp32 (gradients are fp32 in
// every precision). Either output may be null to skip it.
template <typename T>
void linear_backward(T* dx, float* dW, const T* dy, const T* x, const T* W, int N, int in, int out,
                     bool accumulate_dx = false);
template <>
void linear_forward<float>(float* y, const float* x, const float* W, int N, int in, int out,
                           bool accumulate);
template <>
void linear_backward<float>(float* dx, float* dW, const float* dy, const float* x, const float* W,
                            int N, int in, int out, bool accumulate_dx);
// The packed 16-bit GEMM (gemm_packed.cpp), one of the paths of the bf16/f16 linear layers
// (gemm16_path): C (M, N) (+)= op(A) · op(B), A (M, K) or (K, M) stored when ta, B (K, N) or (N, K)
// stored when tb, all row-major; the output is C (T, rounded once) or, when C32 is not null, C32
// (fp32). Each output element is one chain of fp32 FMAs in k order from 0 (or from the old output
// when accumulating): the same bits for any blocking or thread count. Returns false, and does
// nothing, at the level without it (baseline: no FMA) or for an empty shape.
template <typename T>
bool gemm16_packed(bool ta, bool tb, int M, int N, int K, const T* A, const T* B, T* C, float* C32,
                   bool accumulate);

// ---- bias.cpp: the bias of a linear layer -------------------------------------------------------
// y (N, C) += b (C) on every row; T: y and b, the sum in fp32, rounded once.
template <typename T>
void bias_add(T* y, const T* b, int N, int C);
// db (C) fp32 += Σ_n dy (n, :), T: dy. Each column's rows are summed in row order in fp32, then
// added to db: the same bits for any thread count.
template <typename T>
void bias_grad(float* db, const T* dy, int N, int C);

// ---- embedding.cpp: token embedding -------------------------------------------------------------
// out (N, C) = table[ids[n] − v_begin] for ids in [v_begin, v_begin + v_count), zero rows for
// other ids (a vocabulary-parallel shard of the table; v_count < 0: the whole table).
// T: table and out (a copy, exact in every type).
template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int N, int C, int v_begin = 0,
                       int v_count = -1);
// dtable[ids[n] − v_begin] += dout[n] for ids in the shard (rows in order: duplicate ids
// accumulate deterministically). T: dout; dtable (V, C) is fp32.
template <typename T>
void embedding_backward(float* dtable, const int32_t* ids, const T* dout, int N, int C,
                        int v_begin = 0, int v_count = -1);

// ---- rmsnorm.cpp: RMSNorm (HF: x * rsqrt(mean(x²) + eps) * w) -----------------------------------
// T: x, w, out (N, C); rstd (N) fp32, saved for backward.
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int N, int C, float eps);
// T: dout, x, w, dx (N, C) = ... (accumulate_dx: dx += ..., the sum in fp32 and rounded once, so
// dx can be the residual stream's gradient and the norm's branch needs no add of its own);
// dw (C) fp32 += ... (accumulated; null: a frozen weight, dx only). dx must not overlap dout or
// x (they are read again after dx is written).
template <typename T>
void rmsnorm_backward(T* dx, float* dw, const T* dout, const T* x, const T* w, const float* rstd,
                      int N, int C, bool accumulate_dx = false);

// ---- rope.cpp: RoPE, rotate-half pairing (i with i + D/2) ---------------------------------------
// x (B, T, nh, D) rotated in place; position p of (b, t) is pos[b*T + t] (pos (B, T) int32,
// each >= 0: packed samples restart theirs at 0), or t when pos is null. Pair (i, i + D/2) turns
// by the angle float(p) · inv_freq[i]; inv_freq (D/2) carries the rope type's scaling
// (lib/model/rope.h computes it; theta^(-2i/D) without scaling). E: x (T is the sequence length
// here); the angles and the rotation are fp32.
template <typename E>
void rope_forward(E* x, const float* inv_freq, int B, int T, int nh, int D,
                  const int32_t* pos = nullptr);
// Inverse rotation, in place, applied to the gradient.
template <typename E>
void rope_backward(E* dx, const float* inv_freq, int B, int T, int nh, int D,
                   const int32_t* pos = nullptr);

// ---- Causal grouped-query attention (FlashAttention-2: no (B, H, T, T) buffer) ----------------
// q (B, T, H, D), k and v (B, T, K, D), with H a multiple of K (query head h uses kv head h/(H/K)).
// E in {float, bf16, f16}; statistics and math in fp32.
// Queries and keys are processed in tiles of kAttnTile.
inline constexpr int kAttnTile = 64;
// Document masking: seg (B, T) int32 segment ids, or nullptr for one document per sample. A
// document is a run of equal ids along T (ids non-decreasing, as the CUDA kernels require);
// query i attends to the keys j ≤ i of its own document, and the first position of each
// document gets a zero gradient through its scores, as position 0 does. With seg null the
// results are the bits of the kernel without segments.
// out (B, T, H, D); lse (B, H, T) fp32: the per-row logsumexp of the scaled scores, saved for
// backward.
template <typename E>
void attention_forward(E* out, float* lse, const E* q, const E* k, const E* v, int B, int T, int H,
                       int K, int D, const int32_t* seg = nullptr);
// fp32 elements of scratch attention_backward needs: B·H·T (Δ = rowsum(dO ∘ O)), plus B·T·H·D
// for bf16 and f16 (dQ accumulated in fp32).
template <typename E>
size_t attention_backward_scratch_elems(int B, int T, int H, int D);
// Gradients of q, k, v (overwritten) from dout and the forward's out and lse. Deterministic:
// the same bits for any thread count.
template <typename E>
void attention_backward(E* dq, E* dk, E* dv, const E* dout, const E* out, const float* lse,
                        const E* q, const E* k, const E* v, float* scratch, int B, int T, int H,
                        int K, int D, const int32_t* seg = nullptr);

// ---- decode.cpp: generation with a KV cache (ft generate; one sequence) ---------------------
// (Its RoPE is rope_forward with positions pos, pos + 1, ...: lib/model/decode.cpp.)
// Causal grouped-query attention of Tq new queries over a KV cache: q, out (Tq, H, D), query t
// at position pos + t; k, v (pos + Tq, K, D), the cache's rows 0 .. pos + Tq − 1 (the new
// tokens' keys and values already written at rows pos ..). Query t attends to rows ≤ pos + t,
// softmax of q·k / √D in fp32, H a multiple of K as attention_forward's. No lse, no backward.
template <typename E>
void attention_decode(E* out, const E* q, const E* k, const E* v, int pos, int Tq, int H, int K,
                      int D);

// ---- swiglu.cpp: SwiGLU, h = silu(g) * u --------------------------------------------------------
// T: all of h, g, u (n).
template <typename T>
void swiglu_forward(T* h, const T* g, const T* u, size_t n);
// dg, du from dh (overwritten)
template <typename T>
void swiglu_backward(T* dg, T* du, const T* dh, const T* g, const T* u, size_t n);

// ---- cross_entropy.cpp: cross-entropy over the vocabulary ---------------------------------------
// logits (N, V). For each row with mask[n] != 0: loss_n = logsumexp(logits_n) - logits_n[t_n].
// Returns the *sum* of loss_n over masked rows (double, for accurate token-weighted means).
// If dlogits is non-null, writes dlogits = scale * (softmax - onehot) on masked rows, 0 elsewhere
// (dlogits may alias logits). T: logits and dlogits; the max, exp and softmax are fp32, the sums
// double. (T is deduced from logits alone, so dlogits may be nullptr.)
template <typename T>
double cross_entropy_forward_backward(std::type_identity_t<T>* dlogits, const T* logits,
                                      const int32_t* targets, const uint8_t* mask, int N, int V,
                                      float scale);

// Vocabulary-parallel cross-entropy (Megatron-LM): each tensor rank holds logits for
// columns [v_begin, v_begin + V) of the vocabulary. The caller all-reduces between the steps:
//   1. row_max (N) of local logits → all-reduce max;
//   2. ce_partial: sumexp (N) = Σ exp(l − max) and target_logit (N) (0 off this shard) →
//      all-reduce sum of both;
//   3. ce_finish: loss sum over masked rows (the same on every rank) and this shard's dlogits.
// T: logits and dlogits (may alias); row_max fp32, sumexp and target_logit double.
template <typename T>
void row_max(float* out, const T* x, int N, int V);
template <typename T>
void ce_partial(double* sumexp, double* target_logit, const T* logits, const int32_t* targets,
                const uint8_t* mask, const float* row_max, int N, int V, int v_begin);
template <typename T>
double ce_finish(std::type_identity_t<T>* dlogits, const T* logits, const int32_t* targets,
                 const uint8_t* mask, const float* row_max, const double* sumexp,
                 const double* target_logit, int N, int V, int v_begin, float scale);

// ---- reduce.cpp: elementwise accumulate / scale, reductions -------------------------------------
// y += x, T: both (the sum in fp32, rounded once)
template <typename T>
void add_inplace(T* y, const T* x, size_t n);
// y (fp32) += x (T): a 16-bit contribution added into an fp32 accumulator
template <typename T>
void accumulate(float* y, const T* x, size_t n);
void scale_inplace(float* y, float s, size_t n);  // y *= s
// Σ x² in double. Also the found-inf check: the result is finite exactly when every x is
// (a double holds n·FLT_MAX² for any n < 10^231, so no finite input overflows it), so the
// gradient norm's all-reduce carries the overflow flag with no extra pass.
double sum_squares(const float* x, size_t n);

// ---- dropout.cpp: dropout and scaling (LoRA's input dropout and its α/r) ------------------------
// y (rows, cols) = x ∘ m · s, T: x and y, y may be x (in place). Element (i, j) is kept when the
// uniform of (key, row i, column col0 + j) is ≥ p (kernels/philox.h: the whole matrix's mask,
// whatever column slice [col0, col0 + cols) a call holds); kept elements are float(x) · s rounded
// to T once, s = philox::dropout_factor(p, f) (f / (1 − p) rounded to fp32), dropped ones +0.
// p in [0, 1); p = 0: y = x · f, no Philox drawn. The same call on the output's gradient is the
// backward. The bits depend on nothing but the arguments (kernels/cuda/dropout.cu: the same).
template <typename T>
void dropout_scale(T* y, const T* x, size_t rows, size_t cols, size_t col0, float p, float f,
                   uint64_t key);

// ---- nf4.cpp: QLoRA's 4-bit NormalFloat (kernels/nf4.h: the format, the table, the sizes) -------
// Quantize x (n), T: codes (nf4_code_bytes(n)) two indices a byte, high nibble first (an odd
// n's last low nibble 0), absmax (nf4_blocks(n)) fp32 = max |x| of each block of 64. An element's
// index counts the fp32 midpoints kNf4Mids below x / absmax (an fp32 quotient; 0 when the
// absmax is 0). No fma anywhere, so the same bits on every level and on CUDA. Non-finite x (the
// caller checks first): a NaN is left out of the absmax and coded 0 (7 in a block whose absmax
// is 0); an inf makes its block's absmax inf, every finite element of it then 7 (the level 0),
// the inf itself 0 (inf / inf is NaN).
template <typename T>
void quantize_nf4(uint8_t* codes, float* absmax, const T* x, size_t n);
// out (n), T = kNf4Codes[code_i] · a_b rounded to T once, a_b = float(qabsmax[b]) · scale[b / 256]
// / 127 + mean in fp32, left to right, each operation rounded (b = i / 64; nf4_double_quantize
// makes qabsmax (nf4_blocks(n)), scale (nf4_groups(nf4_blocks(n))) and mean).
template <typename T>
void dequantize_nf4(T* out, const uint8_t* codes, const int8_t* qabsmax, const float* scale,
                    float mean, size_t n);

// ---- convert.cpp: fp32 master copy ↔ 16-bit compute copy ----------------------------------------
// dst (n) = src (n) rounded to nearest even / widened exactly: the bits of core/half.h's
// to_bf16 / to_f16 / to_f32, NaN, inf and subnormals included. T: bf16 or f16; the float
// overload is a copy, so code templated on the compute type can call convert for every T.
void convert(float* dst, const float* src, size_t n);
template <typename T>
void convert(T* dst, const float* src, size_t n);
template <typename T>
void convert(float* dst, const T* src, size_t n);

// ---- random.cpp: parameter init
// ------------------------------------------------------------------ out[j] = float(std · z) (n), z
// the standard normal of element first + j under key (kernels/philox.h: Philox-4x32-10 and
// Box–Muller from exactly rounded operations). The bits depend only on (key, first + j): not on the
// thread count, on how a tensor is cut into calls, or on the device (kernels/cuda/random.cu gives
// the same).
void random_normal(float* out, size_t n, uint64_t key, uint64_t first, double std);
// The 2-D form: out (rows, cols), dense, out[r·cols + c] = float(std · z(first + r·ld + c)): a
// block of a row-major tensor whose rows are ld elements apart (a column slice: ld the whole
// tensor's row length), in one call. Its bits are the 1-D form's for each row.
void random_normal(float* out, size_t rows, size_t cols, size_t ld, uint64_t key, uint64_t first,
                   double std);

// ---- adamw.cpp: AdamW (torch.optim.AdamW semantics) ---------------------------------------------
// p ← p(1 − lr·wd); m ← β1 m + (1−β1) g; v ← β2 v + (1−β2) g²;
// p ← p − lr · (m / bc1) / (sqrt(v / bc2) + eps), bc1 = 1 − β1^t, bc2 = 1 − β2^t.
// g is read as float(g · grad_scale): clipping (and fp16's unscaling) folded into the update,
// bit for bit what scale_inplace(g, grad_scale) before it gives, without a pass over g.
// k: the step's constants (adamw_step.h: computed once on the host, in double where torch does).
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamwStep& k,
                  float grad_scale);
// The same update (p, m, v bit for bit as above), and p_compute (n) = p converted to T (as
// convert), in the same pass: the compute copy of the updated shard without a separate cast.
template <typename T>
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamwStep& k,
                  T* p_compute, float grad_scale);
// Both from the hyperparameters and the step count t (1 for the first update).
inline void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int64_t t,
                         float grad_scale = 1.0f) {
  adamw_update(p, g, m, v, n, adamw_step(lr, beta1, beta2, eps, weight_decay, t), grad_scale);
}
template <typename T>
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t t, T* p_compute,
                  float grad_scale = 1.0f) {
  adamw_update(p, g, m, v, n, adamw_step(lr, beta1, beta2, eps, weight_decay, t), p_compute,
               grad_scale);
}

}  // namespace ft::kernels

namespace ft::kernels {
// ---- instruction set (DESIGN §2, "Instruction sets") --------------------------------------------
// The kernels above but the library GEMMs (gemm.cpp, gemm_onednn.cpp) exist once per instruction
// set (kernels/cpu/isa.h; gemm16_packed included); the rest of ft is built for the compiler's
// default x86-64, so one binary runs on any x86-64 CPU. The level,
// chosen once per process, is FT_CPU_ISA=baseline|avx2|avx512|avx512_bf16|amx if set (an unknown
// value, or a level this CPU lacks, is an ft::Error naming the choices), else the highest level
// the CPU (and OS) supports. Each level is a class of CPU, and runs what such a CPU runs:
//   baseline    x86-64 (SSE2): the baseline kernels; oneDNN capped at SSE4.1.
//   avx2        x86-64-v3 (AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE: Haswell, Zen 1-3): the avx2
//               kernels; oneDNN capped at AVX2 (so bf16 GEMMs run in the packed kernel).
//   avx512      x86-64-v4 (AVX-512 F/BW/CD/DQ/VL: Skylake-X, Cascade Lake, Ice Lake): the avx512
//               kernels; oneDNN capped at AVX512_CORE.
//   avx512_bf16 avx512 plus AVX512-BF16 (Cooper Lake, Zen 4 and 5, Sapphire Rapids without AMX):
//               the avx512 kernels; oneDNN capped at AVX512_CORE_BF16.
//   amx         avx512_bf16 plus AMX-BF16 tiles the OS lets ft use (Sapphire Rapids and later):
//               oneDNN uncapped, so its AMX kernels.
// A cap set by ONEDNN_MAX_CPU_ISA itself wins over the one FT_CPU_ISA implies. The levels with FMA
// give the same bits; baseline rounds the product of each a·b + c separately, within every
// tolerance. OpenBLAS chooses its kernels from the CPU model (OPENBLAS_CORETYPE caps it when the
// process starts). Which library runs the 16-bit GEMMs at each level: gemm16_path.
enum class CpuIsa { baseline, avx2, avx512, avx512_bf16, amx };
CpuIsa cpu_isa();
const char* cpu_isa_name(CpuIsa isa);
// The highest level this CPU supports, whatever FT_CPU_ISA says.
CpuIsa cpu_isa_supported();
// The level FT_CPU_ISA=value asks for on a CPU that supports up to `supported` (null or empty:
// `supported`); throws as cpu_isa() does.
CpuIsa parse_cpu_isa(const char* value, CpuIsa supported);

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
// Where the linear layers' bf16 (bf16_operands) or f16 GEMMs run: "oneDNN", "packed for fp32
// FMAs" (gemm16_packed) or "widened to fp32 for OpenBLAS" (gemm_onednn.cpp: the choice by CPU,
// and FT_GEMM16=onednn|packed|widen to force one).
const char* gemm16_path(bool bf16_operands);
// The instruction set oneDNN dispatches its bf16/f16 GEMMs to on this CPU (e.g.
// "avx512_core_amx", "avx512_core_bf16", "avx2"; ONEDNN_MAX_CPU_ISA caps it).
const char* gemm_isa();
}  // namespace ft::kernels
