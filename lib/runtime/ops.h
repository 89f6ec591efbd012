// The ops of a Device: the one place where model, ZeRO and optimizer code reach kernels. Each
// method is one op of kernels/kernels.h with the same contract; a backend implements it by
// launching its kernel (the CPU calls kernels/cpu/, CUDA will launch kernels/cuda/ on the
// stream). Pointers are device pointers of the Device the Ops came from.
//
// Tensors whose element type follows the precision policy (activations, the compute copy of the
// parameters, their gradients inside the model) are passed as Ref/CRef: a pointer with its
// DType, so one entry point serves fp32, bf16 and fp16 and the backend picks the kernel
// instance. Tensors that are fp32 in every precision (RMSNorm statistics, weight gradients,
// master weights, AdamW moments) are plain float pointers. Scalars a step needs (loss sums,
// squared norms) accumulate into device memory (`double* acc`) and are read back once per step.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/half.h"

namespace ft {

// A stream of work on a device (CUDA: a cudaStream_t). Ops on one stream run in order; the CPU
// runs every op to completion before returning and ignores it.
struct Stream {
  void* handle = nullptr;
};

// A device pointer and its element type. Converts from typed pointers, so call sites read as
// plain pointer arithmetic on typed buffers.
struct Ref {
  void* ptr = nullptr;
  DType dtype = DType::kF32;
  Ref() = default;
  Ref(void* p, DType t) : ptr(p), dtype(t) {}
  Ref(float* p) : ptr(p), dtype(DType::kF32) {}
  Ref(bf16* p) : ptr(p), dtype(DType::kBF16) {}
  Ref(f16* p) : ptr(p), dtype(DType::kF16) {}
  // The element `i` places further on.
  Ref operator+(size_t i) const {
    return Ref(static_cast<char*>(ptr) + i * dtype_size(dtype), dtype);
  }
};

struct CRef {
  const void* ptr = nullptr;
  DType dtype = DType::kF32;
  CRef() = default;
  CRef(const void* p, DType t) : ptr(p), dtype(t) {}
  CRef(Ref r) : ptr(r.ptr), dtype(r.dtype) {}
  CRef(const float* p) : ptr(p), dtype(DType::kF32) {}
  CRef(const bf16* p) : ptr(p), dtype(DType::kBF16) {}
  CRef(const f16* p) : ptr(p), dtype(DType::kF16) {}
  CRef operator+(size_t i) const {
    return CRef(static_cast<const char*>(ptr) + i * dtype_size(dtype), dtype);
  }
};

// Whether n elements at a and n elements at b (both of a's element type) share a byte: the
// backends' cheap check that an output does not overlap an input it reads after writing.
inline bool ranges_overlap(CRef a, CRef b, size_t n) {
  const size_t bytes = n * dtype_size(a.dtype);
  const auto pa = reinterpret_cast<uintptr_t>(a.ptr), pb = reinterpret_cast<uintptr_t>(b.ptr);
  return bytes > 0 && pa < pb + bytes && pb < pa + bytes;
}

class Ops {
 public:
  virtual ~Ops() = default;

  // ---- GEMM: kernels/cpu/gemm.cpp ----
  // y (N, out) (+)= x (N, in) · Wᵀ, W (out, in).
  virtual void linear_forward(Stream s, Ref y, CRef x, CRef W, int N, int in, int out,
                              bool accumulate) = 0;
  // dx (N, in) (+)= dy · W; dW (out, in) += dyᵀ · x in fp32. Either output may be null.
  virtual void linear_backward(Stream s, Ref dx, float* dW, CRef dy, CRef x, CRef W, int N,
                               int in, int out, bool accumulate_dx) = 0;

  // ---- Embedding: the table holds rows [v_begin, v_begin + v_count) of the vocabulary ----
  virtual void embedding_forward(Stream s, Ref out, const int32_t* ids, CRef table, int N, int C,
                                 int v_begin, int v_count) = 0;
  virtual void embedding_backward(Stream s, float* dtable, const int32_t* ids, CRef dout, int N,
                                  int C, int v_begin, int v_count) = 0;

  // ---- RMSNorm ----
  virtual void rmsnorm_forward(Stream s, Ref out, float* rstd, CRef x, CRef w, int N, int C,
                               float eps) = 0;
  // dx (N, C) = the norm's input gradient, or dx += it (accumulate_dx: the residual stream's
  // gradient takes the norm branch's share in the same pass, no add). dx must overlap neither
  // dout nor x (checked: an ft::Error).
  virtual void rmsnorm_backward(Stream s, Ref dx, float* dw, CRef dout, CRef x, CRef w,
                                const float* rstd, int N, int C, bool accumulate_dx) = 0;

  // ---- RoPE (inv_freq: D/2 floats in device memory) ----
  virtual void rope_forward(Stream s, Ref x, const float* inv_freq, int B, int T, int nh,
                            int D) = 0;
  virtual void rope_backward(Stream s, Ref dx, const float* inv_freq, int B, int T, int nh,
                             int D) = 0;

  // ---- Causal grouped-query attention (FlashAttention-2): lse (B, H, T) fp32 per-row
  // logsumexp saved by forward; backward recomputes the probabilities from q, k, out and lse.
  virtual void attention_forward(Stream s, Ref out, float* lse, CRef q, CRef k, CRef v, int B,
                                 int T, int H, int K, int D) = 0;
  // fp32 elements of the scratch attention_backward needs for this dtype and shape.
  virtual size_t attention_backward_scratch_elems(DType t, int B, int T, int H, int D) = 0;
  virtual void attention_backward(Stream s, Ref dq, Ref dk, Ref dv, CRef dout, CRef out,
                                  const float* lse, CRef q, CRef k, CRef v, float* scratch,
                                  int B, int T, int H, int K, int D) = 0;

  // ---- SwiGLU ----
  virtual void swiglu_forward(Stream s, Ref h, CRef g, CRef u, size_t n) = 0;
  virtual void swiglu_backward(Stream s, Ref dg, Ref du, CRef dh, CRef g, CRef u, size_t n) = 0;

  // ---- Cross-entropy: *loss_acc += Σ loss over masked rows ----
  virtual void cross_entropy(Stream s, Ref dlogits, CRef logits, const int32_t* targets,
                             const uint8_t* mask, int N, int V, float scale,
                             double* loss_acc) = 0;
  // Vocabulary-parallel pieces (kernels.h: row_max, ce_partial, ce_finish).
  virtual void row_max(Stream s, float* out, CRef x, int N, int V) = 0;
  virtual void ce_partial(Stream s, double* sumexp, double* target_logit, CRef logits,
                          const int32_t* targets, const uint8_t* mask, const float* row_max,
                          int N, int V, int v_begin) = 0;
  virtual void ce_finish(Stream s, Ref dlogits, CRef logits, const int32_t* targets,
                         const uint8_t* mask, const float* row_max, const double* sumexp,
                         const double* target_logit, int N, int V, int v_begin, float scale,
                         double* loss_acc) = 0;

  // ---- Casts: dst = src converted to dst's dtype (round to nearest even); same dtype: a copy.
  virtual void convert(Stream s, Ref dst, CRef src, size_t n) = 0;

  // ---- Elementwise and reductions ----
  virtual void add(Stream s, Ref y, CRef x, size_t n) = 0;             // y += x
  virtual void scale(Stream s, float* y, float f, size_t n) = 0;        // y *= f
  // *acc += Σ x² / divisor (in double).
  virtual void sum_squares(Stream s, double* acc, const float* x, size_t n, double divisor) = 0;

  // ---- AdamW (kernels.h; t is the step count after increment; g is read as g · grad_scale,
  // clipping folded into the update). p_compute (n), unless null: the updated p rounded to its
  // dtype in the same pass (the compute copy of the precision policy, without a convert).
  virtual void adamw_update(Stream s, float* p, const float* g, float* m, float* v, size_t n,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            int64_t t, float grad_scale, Ref p_compute) = 0;
};

}  // namespace ft
