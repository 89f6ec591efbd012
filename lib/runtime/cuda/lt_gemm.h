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
//     lib/core/log.cpp
//     -L/usr/local/cuda/lib64 -lcublasLt -o /tmp/lt_gemm_link_check.so
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "runtime/cuda/lt_layout.h"

namespace ft::cuda {

// cuBLASLt workspace for a GPU of compute capability `sm_major`.x: the cuBLAS API reference
// (cublasSetWorkspace) recommends 32 MiB on Hopper and 4 MiB on other architectures; sm_90 and
// later get 32 MiB. The CUDA ops allocate it once, at start-up (ops_memory.h, which defines
// this in plain C++ so that `ft plan` counts it).
size_t lt_workspace_bytes(int sm_major);

// How each problem's algorithm is chosen (runtime.gemm_algos). Without `measure`: the
// heuristic's first, as cuBLASLt ranks them (the same on every run). With it: the first call of
// a problem times up to kLtCandidates of the heuristic's algorithms on that call's own operands
// (an accumulating in-place output is saved first and put back after each try) and keeps the
// fastest; timings differ between runs, so the choices are appended to `record` as they are
// made, and an LtGemm that finds the file takes them from it instead of measuring again: a run
// resumed in the same folder makes the same choices, hence the same bits, as the run it
// continues. A record written on another GPU or cuBLASLt (`device`, and the library's version)
// is set aside with a warning and measured afresh. cuBLASLt documents its algorithm structure
// as serialisable for reuse with the same library version; each taken from the record is still
// checked (cublasLtMatmulAlgoCheck) and measured again when the check fails.
struct LtChoice {
  static constexpr int kLtCandidates = 8;
  bool measure = false;
  std::string record;  // the file of choices ("" keeps them in memory only)
  std::string device;  // the GPU, as a record names it (e.g. "NVIDIA H200 (sm_90, 132 SMs)")
  // What timing needs of the GPU runtime, from the caller (the CUDA ops; a test its own), so
  // this file needs none of it: milliseconds `work` takes on `stream` (after it completes);
  // device scratch (null when none is free) and its release; a copy ordered on the stream.
  std::function<float(void* stream, const std::function<void()>& work)> time_ms;
  std::function<void*(size_t bytes)> alloc;
  std::function<void(void* p, size_t bytes)> free;
  std::function<void(void* dst, const void* src, size_t bytes, void* stream)> copy;
};

class LtGemm {
 public:
  // `workspace`: device memory of `workspace_bytes`, owned by the caller and alive as long as
  // this LtGemm; used by one stream at a time (calls on two streams at once would share it).
  // `allow_tf32`: fp32 GEMMs may round their inputs to TF32 (runtime.tf32). `choice`: how
  // algorithms are chosen (above); its record, when named, is read here.
  LtGemm(void* workspace, size_t workspace_bytes, bool allow_tf32, LtChoice choice = {});
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
  // Of those: chosen by timing, and taken from the record.
  size_t measured_problems() const;
  size_t recorded_problems() const;
  size_t workspace_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ft::cuda
