// The ops of a Device: the one place where model, ZeRO and optimizer code reach kernels. The
// ops are declared once, in op_list.h, each with its contract; a backend implements each by
// calling its kernels (the CPU runs kernels/cpu/ at once; CUDA queues kernels/cuda/ launchers
// or cuBLASLt on the op's stream). Pointers are device pointers of the Device the Ops came from.
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
#include <string>

#include "core/dtype.h"
#include "core/half.h"

namespace ft::kernels {
struct AdamwArgs;  // kernels/adamw_step.h: adamw_update's step constants and gradient factor
}  // namespace ft::kernels

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
  Ref(double* p) : ptr(p), dtype(DType::kF64) {}
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
  CRef(const double* p) : ptr(p), dtype(DType::kF64) {}
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

// One pure virtual method per op of op_list.h, with the contract written there. The backends
// (cpu_ops.cpp, cuda/cuda_ops.cpp) implement each by hand; decorators forward them
// (forwarding_ops.h).
class Ops {
 public:
  virtual ~Ops() = default;

#define FT_OP(name, family, params, args) virtual void name params = 0;
#include "runtime/op_list.h"

  // fp32 elements of the scratch attention_backward needs for this dtype and shape on this
  // backend. A size query, not an op: it does no work, so it is not in the op list (the
  // decorators forward it by hand).
  virtual size_t attention_backward_scratch_elems(DType t, int B, int T, int H, int D) = 0;
  // Why attention of this dtype and head dim cannot take document segments (a non-null seg,
  // op_list.h) on this backend, or "" when it can. A query, not an op, like the one above: the
  // trainer asks it at start-up, so that data.pack on a shape the backend cannot mask is
  // refused before any work rather than at the first step's attention.
  virtual std::string attention_segments_refusal(DType, int /*D*/) { return {}; }
};

}  // namespace ft
