// GEMMs of the CUDA backend through cuBLASLt: the linear layers of kernels.h (linear_forward,
// linear_backward) on a stream, mapped by lt_layout.h's map_linear. This header needs no CUDA
// headers (the handle and the cache are behind a pointer), so the CUDA Device includes it from
// plain C++.
//
// Numerics, as the CPU reference: bf16/fp16 inputs with fp32 accumulation and one rounding to
// the output type (y, dx) or fp32 output (dW, accumulating); fp32 with TF32 off unless the
// LtGemm is built with allow_tf32 (runtime.tf32: true). Determinism: one toolkit gives the
// same bits on every run on GPUs of one architecture and SM count (cuBLAS guide, "Results
// reproducibility"; with a caller-owned workspace, as here, no hidden per-stream workspace can
// change the choice); the algorithm is chosen once per problem and cached, so every step of a
// run uses the same one.
//
// Use from the CUDA Ops: one LtGemm per Device, created once the allocator can give it
// lt_workspace_bytes(major) bytes; Ops::linear_forward(s, y, x, W, ...) becomes
// linear_forward(y.ptr, x.ptr, W.ptr, y.dtype, ..., stream) after checking that x and W (and dy
// in backward) carry y's dtype, since this interface takes one element type for all of them.
//
// Built twice: against libcublasLt for the GPU, and against tests/cuda_emu/cublaslt_emu.cpp (a
// test tool: the same API with a naive reference GEMM) so CI runs this file without a GPU.
// Standalone check that it compiles and links against the real library (no GPU needed; one
// command line, --no-undefined makes every cuBLASLt symbol resolve):
//   g++ -std=c++20 -shared -fPIC -Wl,--no-undefined -I. -Ilib -I/usr/local/cuda/include
//     lib/runtime/cuda/lt_gemm.cpp lib/runtime/cuda/lt_layout.cpp lib/core/dtype.cpp
//     -L/usr/local/cuda/lib64 -lcublasLt -o /tmp/lt_gemm_link_check.so
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "runtime/cuda/lt_layout.h"

namespace ft::cuda {

// cuBLASLt workspace for a GPU of compute capability `sm_major`.x: the cuBLAS API reference
// (cublasSetWorkspace) recommends 32 MiB on Hopper and 4 MiB on other architectures; sm_90 and
// later get 32 MiB. The CUDA ops allocate it once, at start-up (ops_memory.h, which defines
// this in plain C++ so that `ft plan` counts it).
size_t lt_workspace_bytes(int sm_major);

class LtGemm {
 public:
  // `workspace`: device memory of `workspace_bytes`, owned by the caller and alive as long as
  // this LtGemm; used by one stream at a time (calls on two streams at once would share it).
  // `allow_tf32`: fp32 GEMMs may round their inputs to TF32 (runtime.tf32).
  LtGemm(void* workspace, size_t workspace_bytes, bool allow_tf32);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // y (N, out) (+)= x (N, in) · Wᵀ, W (out, in); x, W, y of element type `t`.
  void linear_forward(void* y, const void* x, const void* W, DType t, int N, int in, int out,
                      bool accumulate, void* stream);
  // y (N, out) = r (N, out) + x (N, in) · Wᵀ, r cuBLASLt's C and y its D (beta = 1): the bits of
  // linear_forward accumulating into a copy of r (the cached algorithm sees r only through its
  // alignment: the same one when r is aligned as y is). r is y (in place) or disjoint from it.
  void linear_forward_residual(void* y, const void* r, const void* x, const void* W, DType t, int N,
                               int in, int out, void* stream);
  // dx (N, in) (+)= dy · W; dW (out, in) += dyᵀ · x in fp32. Either output may be null.
  void linear_backward(void* dx, float* dW, const void* dy, const void* x, const void* W, DType t,
                       int N, int in, int out, bool accumulate_dx, void* stream);

  // One product; `call.allow_tf32` is replaced by this LtGemm's setting.
  void linear(LinearCall call, void* stream);
  // Any strided-batched row-major product (lt_layout.h); `allow_tf32` replaced likewise.
  void gemm(GemmCall call, void* stream);

  // Distinct problems seen (each asked cuBLASLt's heuristic once): for tests and the profile.
  size_t cached_problems() const;
  size_t workspace_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ft::cuda
