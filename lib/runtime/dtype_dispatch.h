// From a runtime element type to the C++ type of the kernels: the one switch every backend's
// ops (cpu_ops.cpp, cuda/cuda_ops.cpp, cuda/attention_gemm.cpp) calls its templates through.
#pragma once

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"

namespace ft {

// Calls f with a value of the element type t stands for (float, bf16 or
// f16); any other type is an ft::Error naming `what` (the op) and the type.
template <typename F>
void dispatch(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::kF32:
      f(float{});
      return;
    case DType::kBF16:
      f(bf16{});
      return;
    case DType::kF16:
      f(f16{});
      return;
    default:
      FT_FAIL(what, ": no kernel for element type ", dtype_name(t));
  }
}
template <typename F>
void dispatch(DType t, F&& f) {
  dispatch(t, "an op", std::forward<F>(f));
}

}  // namespace ft
