// The ops of a Device, declared once. Everything that lists the ops is generated from this file:
// Ops' pure virtual methods (ops.h), the forwarding decorators of the guard device and of
// FT_PROFILE (forwarding_ops.h), the op families of the profile (profile.h) and the backend
// conformance harness's check that every op has a case (tests/ops/). A backend still writes
// each op by hand (cpu_ops.cpp, cuda/cuda_ops.cpp): `override` makes the compiler hold its
// signature to the one here, and a backend that lacks an op cannot be instantiated.
//
// An X-macro file, included several times (no include guard): define FT_OP and/or
// FT_OP_FAMILY, include it, and it #undefs both at its end.
//   FT_OP_FAMILY(id, "label")   an OpFamily enumerator of the profile and its name in the
//                               table, in the table's order
//   FT_OP(name, family, (params), (args))
//                               one op: `void name params`, timed into OpFamily::family; args
//                               names the params in order (what a decorator passes on). The
//                               first param is always `Stream s`.
// Each op's comment is its contract (the kernels' own, in kernels/kernels.h, say more about
// precision). Pointers are device pointers of the Device the Ops came from.
// One op a block, as written: clang-format would pack the blocks differently each time.
// clang-format off
#ifndef FT_OP
#define FT_OP(name, family, params, args)
#endif
#ifndef FT_OP_FAMILY
#define FT_OP_FAMILY(id, label)
#endif

// ---- Op families (the profile's table prints them in this order, then profile.h's own:
// linear_backward's two GEMMs, copies, memsets) ----
FT_OP_FAMILY(kAttentionForward, "attention forward")
FT_OP_FAMILY(kAttentionBackward, "attention backward")
FT_OP_FAMILY(kRmsnorm, "rmsnorm")
FT_OP_FAMILY(kRope, "rope")
FT_OP_FAMILY(kSwiglu, "swiglu")
FT_OP_FAMILY(kCrossEntropy, "cross-entropy")
FT_OP_FAMILY(kEmbedding, "embedding")
FT_OP_FAMILY(kAdamw, "adamw")
FT_OP_FAMILY(kConvert, "convert")
FT_OP_FAMILY(kAdd, "add")
FT_OP_FAMILY(kScale, "scale")
FT_OP_FAMILY(kDropout, "dropout")
FT_OP_FAMILY(kNf4, "nf4")
FT_OP_FAMILY(kSumSquares, "sum_squares")
FT_OP_FAMILY(kBias, "bias")
FT_OP_FAMILY(kGemmForward, "GEMM forward")
FT_OP_FAMILY(kRandom, "random init")

// ---- GEMM: kernels/cpu/gemm.cpp; cuBLASLt on CUDA ----
// y (N, out) (+)= x (N, in) · Wᵀ, W (out, in).
FT_OP(linear_forward, kGemmForward,
      (Stream s, Ref y, CRef x, CRef W, int N, int in, int out, bool accumulate),
      (s, y, x, W, N, in, out, accumulate))
// y (N, out) = r (N, out) + x (N, in) · Wᵀ: a residual added by the GEMM, which reads r and writes
// y (cuBLASLt's C and D), instead of a copy of r into y before an accumulating linear_forward.
// The bits of that copy then linear_forward with accumulate, on each backend. r is y (in place:
// linear_forward's +=) or a buffer disjoint from it.
FT_OP(linear_forward_residual, kGemmForward,
      (Stream s, Ref y, CRef r, CRef x, CRef W, int N, int in, int out),
      (s, y, r, x, W, N, in, out))
// dx (N, in) (+)= dy · W; dW (out, in) += dyᵀ · x in fp32. Either output may be null. (The
// profile times dx and dW as two calls: kGemmDx, then kGemmDw.)
FT_OP(linear_backward, kGemmDx,
      (Stream s, Ref dx, float* dW, CRef dy, CRef x, CRef W, int N, int in, int out,
       bool accumulate_dx),
      (s, dx, dW, dy, x, W, N, in, out, accumulate_dx))

// ---- Bias of a linear layer (Qwen2's q, k, v projections): kernels/cpu/bias.cpp ----
// y (N, C) += b (C) on every row, the sum in fp32 and rounded once.
FT_OP(bias_add, kBias,
      (Stream s, Ref y, CRef b, int N, int C),
      (s, y, b, N, C))
// db (C) fp32 += Σ_n dy (n, :), summed in an order fixed by (N, C): the same bits on every run.
FT_OP(bias_grad, kBias,
      (Stream s, float* db, CRef dy, int N, int C),
      (s, db, dy, N, C))

// ---- Embedding: the table holds rows [v_begin, v_begin + v_count) of the vocabulary ----
// out (N, C) = table[ids[n] − v_begin]; ids outside the shard give zero rows.
FT_OP(embedding_forward, kEmbedding,
      (Stream s, Ref out, const int32_t* ids, CRef table, int N, int C, int v_begin,
       int v_count),
      (s, out, ids, table, N, C, v_begin, v_count))
// dtable (v_count, C) fp32 += dout (N, C) of the shard's ids, each row's tokens in token order.
FT_OP(embedding_backward, kEmbedding,
      (Stream s, float* dtable, const int32_t* ids, CRef dout, int N, int C, int v_begin,
       int v_count),
      (s, dtable, ids, dout, N, C, v_begin, v_count))

// ---- RMSNorm ----
// out (N, C) = x · rstd · w; rstd (N) fp32, saved for the backward.
FT_OP(rmsnorm_forward, kRmsnorm,
      (Stream s, Ref out, float* rstd, CRef x, CRef w, int N, int C, float eps),
      (s, out, rstd, x, w, N, C, eps))
// dx (N, C) = the norm's input gradient, or dx += it (accumulate_dx: the residual stream's
// gradient takes the norm branch's share in the same pass, no add); dw (C) fp32 += its
// gradient, or null (a frozen weight: dx only). dx must overlap neither dout nor x (checked: an
// ft::Error).
FT_OP(rmsnorm_backward, kRmsnorm,
      (Stream s, Ref dx, float* dw, CRef dout, CRef x, CRef w, const float* rstd, int N, int C,
       bool accumulate_dx),
      (s, dx, dw, dout, x, w, rstd, N, C, accumulate_dx))

// ---- RoPE: x (B, T, nh, D) rotated in place (inv_freq: D/2 floats in device memory); pos
// (B, T) int32 positions in device memory (packed samples restart at 0), or nullptr for t ----
FT_OP(rope_forward, kRope,
      (Stream s, Ref x, const float* inv_freq, int B, int T, int nh, int D, const int32_t* pos),
      (s, x, inv_freq, B, T, nh, D, pos))
// The inverse rotation, applied to the gradient in place.
FT_OP(rope_backward, kRope,
      (Stream s, Ref dx, const float* inv_freq, int B, int T, int nh, int D, const int32_t* pos),
      (s, dx, inv_freq, B, T, nh, D, pos))

// ---- Causal grouped-query attention (FlashAttention-2): q, out (B, T, H, D), k, v
// (B, T, K, D); lse (B, H, T) fp32 per-row logsumexp saved by forward; backward recomputes the
// probabilities from q, k, out and lse. The scratch of the backward is sized by
// Ops::attention_backward_scratch_elems (ops.h; a size query, not an op).
// Document masking: seg (B, T) int32 in device memory, or nullptr (each sample one document).
// A document is a run of equal ids, ids non-decreasing along T; query i attends to the keys
// j ≤ i of its own document, and each document's first position gets a zero gradient through
// its scores (as position 0 does). Forward and backward must get the same seg. On CUDA the
// fused kernel and the CPU take seg; the chunked-GEMM and SIMT paths (FT_CUDA_ATTENTION=gemm|
// simt, and the fallback for fp32 and head dims other than 64 and 128) refuse a non-null seg
// with an ft::Error: their causal mask is a key bound per query chunk or row, and a document
// start would need a second, lower bound threaded through every kernel and GEMM chunk, for
// comparison paths the fused kernel supersedes. ----
FT_OP(attention_forward, kAttentionForward,
      (Stream s, Ref out, float* lse, CRef q, CRef k, CRef v, const int32_t* seg, int B, int T,
       int H, int K, int D),
      (s, out, lse, q, k, v, seg, B, T, H, K, D))
// dq, dk, dv overwritten.
FT_OP(attention_backward, kAttentionBackward,
      (Stream s, Ref dq, Ref dk, Ref dv, CRef dout, CRef out, const float* lse, CRef q, CRef k,
       CRef v, const int32_t* seg, float* scratch, int B, int T, int H, int K, int D),
      (s, dq, dk, dv, dout, out, lse, q, k, v, seg, scratch, B, T, H, K, D))

// ---- Generation with a KV cache (ft generate; one sequence, kernels.h "decode.cpp") ----
// out (Tq, H, D) = causal attention of q (Tq, H, D), query t at position pos + t, over the
// cache's keys and values k, v (pos + Tq, K, D): query t sees rows ≤ pos + t. No lse.
FT_OP(attention_decode, kAttentionForward,
      (Stream s, Ref out, CRef q, CRef k, CRef v, int pos, int Tq, int H, int K, int D),
      (s, out, q, k, v, pos, Tq, H, K, D))

// ---- SwiGLU: h (n) = silu(g) · u ----
FT_OP(swiglu_forward, kSwiglu,
      (Stream s, Ref h, CRef g, CRef u, size_t n),
      (s, h, g, u, n))
// dg, du (n) overwritten from dh.
FT_OP(swiglu_backward, kSwiglu,
      (Stream s, Ref dg, Ref du, CRef dh, CRef g, CRef u, size_t n),
      (s, dg, du, dh, g, u, n))

// ---- Cross-entropy over logits (N, V): *loss_acc += Σ loss over masked rows ----
// dlogits (may be null: the loss only; may alias logits) = scale · (softmax − onehot) on masked
// rows, 0 elsewhere. scale points to one fp32 in device memory, read when the op runs in stream
// order (so a captured graph takes each replay's value); it may be null when dlogits is.
FT_OP(cross_entropy, kCrossEntropy,
      (Stream s, Ref dlogits, CRef logits, const int32_t* targets, const uint8_t* mask, int N,
       int V, const float* scale, double* loss_acc),
      (s, dlogits, logits, targets, mask, N, V, scale, loss_acc))
// Vocabulary-parallel pieces (kernels.h: row_max, ce_partial, ce_finish); this shard holds
// columns [v_begin, v_begin + V). out (N) fp32 = each row's max.
FT_OP(row_max, kCrossEntropy,
      (Stream s, float* out, CRef x, int N, int V),
      (s, out, x, N, V))
// sumexp (N) = Σ exp(l − row_max), target_logit (N) = the target's logit (0 off this shard),
// both double, overwritten, and 0 on rows the mask leaves out.
FT_OP(ce_partial, kCrossEntropy,
      (Stream s, double* sumexp, double* target_logit, CRef logits, const int32_t* targets,
       const uint8_t* mask, const float* row_max, int N, int V, int v_begin),
      (s, sumexp, target_logit, logits, targets, mask, row_max, N, V, v_begin))
// The all-reduced statistics in: this shard's dlogits (as cross_entropy's, scale too), *loss_acc
// += the loss sum (the same on every shard).
FT_OP(ce_finish, kCrossEntropy,
      (Stream s, Ref dlogits, CRef logits, const int32_t* targets, const uint8_t* mask,
       const float* row_max, const double* sumexp, const double* target_logit, int N, int V,
       int v_begin, const float* scale, double* loss_acc),
      (s, dlogits, logits, targets, mask, row_max, sumexp, target_logit, N, V, v_begin, scale,
       loss_acc))

// ---- Casts: dst (n) = src converted to dst's dtype (round to nearest even); same dtype: a
// copy. One side fp32 (CUDA has no 16-bit to 16-bit kernel; training never asks for one). ----
FT_OP(convert, kConvert,
      (Stream s, Ref dst, CRef src, size_t n),
      (s, dst, src, n))

// ---- Elementwise and reductions ----
// y (n) += x, the sum in fp32 and rounded once.
FT_OP(add, kAdd,
      (Stream s, Ref y, CRef x, size_t n),
      (s, y, x, n))
// y (n) *= f.
FT_OP(scale, kScale,
      (Stream s, float* y, float f, size_t n),
      (s, y, f, n))
// *acc += Σ x² / divisor (in double).
FT_OP(sum_squares, kSumSquares,
      (Stream s, double* acc, const float* x, size_t n, double divisor),
      (s, acc, x, n, divisor))

// ---- Parameter init (kernels/philox.h) ----
// out (rows, cols) fp32, dense: out[r·cols + c] = std · z(first + r·ld + c), z(i) the standard
// normal of element i of a tensor under key (Philox-4x32-10, Box–Muller from exactly rounded
// operations): a block of a row-major tensor whose rows are ld apart (a column slice in one
// call); rows = 1 draws the contiguous run [first, first + cols). The same bits on every device
// and thread count, and for any cut of the tensor into calls.
FT_OP(random_normal, kRandom,
      (Stream s, float* out, size_t rows, size_t cols, size_t ld, uint64_t key, uint64_t first,
       double std),
      (s, out, rows, cols, ld, key, first, std))

// ---- Dropout and scaling (LoRA's dropout on an adapter's input and its α/r, issue 28; the mask
// from kernels/philox.h) ----
// y (rows, cols) = x ∘ m · f / (1 − p), m a Bernoulli(1 − p) mask: element (i, j) is kept when
// u(key, i, col0 + j) ≥ p, u uniform in [0, 1) from Philox (kernels/philox.h) on the counter
// (i, col0 + j) under key — so the mask of a column slice [col0, col0 + cols) of a wider matrix
// is that matrix's mask there (tensor-parallel ranks holding column slices agree). p = 0: y = f·x,
// no random numbers drawn. p in [0, 1). y may be x (in place; any other overlap is an
// ft::Error). Any float dtype, x's and y's the same; the product is formed in fp32 and rounded
// once: a kept element is float(x) · s rounded to y's dtype, s = f / (1 − p) rounded to fp32
// (philox::dropout_factor), a dropped one +0. The same call (the same rows, cols, col0, p, f,
// key) on the output's gradient is its backward: the mask is drawn again, never stored. The key
// is the caller's (one per step, micro-batch and module, dropout's own), one uint64 in device
// memory read when the op runs (so a recorded graph takes each replay's); null when p = 0. The
// same bits on every device and thread count.
FT_OP(dropout_scale, kDropout,
      (Stream s, Ref y, CRef x, size_t rows, size_t cols, size_t col0, float p, float f,
       const uint64_t* key),
      (s, y, x, rows, cols, col0, p, f, key))

// ---- NF4, QLoRA's 4-bit storage of frozen weights (issue 28; the format, the table and the host
// double quantization of the absmaxes: kernels/nf4.h) ----
// x (n) → codes (nf4_code_bytes(n) = ⌈n/2⌉ bytes), absmax (nf4_blocks(n) = ⌈n/64⌉ fp32): per
// block of 64 elements (the last may be shorter) its absmax = max |x|, and each element the index
// of the NF4 level nearest to x / absmax (fp32; ties to the lower; 0 / 0 reads as 0), two a byte,
// element 2j in the high nibble of byte j (an odd n's last low nibble 0). x: any float dtype.
// Finite x is the caller's to check: a NaN is left out of the absmax and coded 0, an inf makes
// its block's absmax inf (kernels.h). The same bits on every device and thread count.
FT_OP(quantize_nf4, kNf4,
      (Stream s, uint8_t* codes, float* absmax, CRef x, size_t n),
      (s, codes, absmax, x, n))
// out (n) = level[code_i] · a_b rounded to out's dtype (any float dtype) once, a_b = float(
// qabsmax[b]) · scale[b / 256] / 127 + mean in fp32, left to right, each operation rounded (no
// fma), b = i / 64: qabsmax (⌈n/64⌉ int8), scale (⌈n/64/256⌉ fp32) and mean from
// nf4_double_quantize of quantize_nf4's absmax. The same bits on every device and thread count.
FT_OP(dequantize_nf4, kNf4,
      (Stream s, Ref out, const uint8_t* codes, const int8_t* qabsmax, const float* scale,
       float mean, size_t n),
      (s, out, codes, qabsmax, scale, mean, n))

// ---- AdamW (kernels.h; g is read as g · grad_scale, clipping folded into the update). args:
// the step's constants (kernels::adamw_step of lr, the betas, eps, the weight decay and the step
// count after increment) and grad_scale, in the memory of the Ops' device (host memory for
// host_ops), read when the op runs (so a recorded graph takes each step's). p_compute (n),
// unless null: the updated p rounded to its dtype in the same pass (the compute copy of the
// precision policy, without a convert). ----
FT_OP(adamw_update, kAdamw,
      (Stream s, float* p, const float* g, float* m, float* v, size_t n,
       const kernels::AdamwArgs* args, Ref p_compute),
      (s, p, g, m, v, n, args, p_compute))

// clang-format on
#undef FT_OP
#undef FT_OP_FAMILY
