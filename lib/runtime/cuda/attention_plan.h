// Where attention on tensor cores keeps what in its scratch (attention_gemm.h): byte offsets
// of each buffer, each 256-byte aligned. Pure; shared by attention_gemm.cpp (which carves the
// scratch) and attention_plan.cpp (which sizes it for the ops and `ft plan`).
#pragma once

#include <cstddef>

#include "core/dtype.h"
#include "runtime/cuda/attention_gemm.h"

namespace ft::cuda {

struct AttentionScratch {
  // Head-major copies: q (B·K, T, G, D), k, v (B·K, T, D) in the compute dtype; o_or_do is out
  // (forward) or dO (backward) like q; backward adds dq like q and the fp32 sums dk, dv.
  size_t q = 0, k = 0, v = 0, o_or_do = 0, dq = 0, dk = 0, dv = 0;
  // A chunk's scores S (fp32) and the second buffer (P in 16-bit; dP in fp32 backward).
  size_t s = 0, second = 0;
  size_t bytes = 0;  // the whole
  AttentionScratch(int B, int T, int H, int K, int D, DType dtype, const AttentionGemmPlan& plan,
                   bool backward);
};

}  // namespace ft::cuda
