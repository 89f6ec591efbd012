// The mapping from ft's row-major linear layers to cuBLASLt's column-major GEMM: one pure
// function (no CUDA calls, no CUDA headers), so the unit tests check it in every build.
//
// cuBLASLt computes D (m, n) = alpha · op(A) · op(B) + beta · C, every matrix column-major: a
// layout (rows, cols, ld) describes a matrix as stored, before op(). A row-major (r, c) matrix
// with row stride c is, read column-major, its transpose: (c, r) with ld c. So each of our
// row-major products Y = P · Q is computed as the column-major Yᵀ = Qᵀ · Pᵀ, with no copies:
//   forward  y (N, out) = x (N, in) · Wᵀ   ->  yᵀ (out, N)  = op_T(W: in×out) · x: in×N
//   dx       dx (N, in) = dy (N, out) · W   ->  dxᵀ (in, N)  = W: in×out · dy: out×N
//   dW       dW (out, in) += dyᵀ · x         ->  dWᵀ (in, out) = x: in×N · op_T(dy: out×N)
// (each operand written as its column-major stored shape).
//
// The enums below carry the numeric values of CUDA's library_types.h / cublas_api.h so
// lt_gemm.cpp passes them through with a static_assert per value, not a table.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace ft::cuda {

enum class LtOp : int32_t { kN = 0, kT = 1 };                     // cublasOperation_t
enum class LtType : int32_t { kF32 = 0, kF16 = 2, kBF16 = 14 };   // cudaDataType_t
enum class LtCompute : int32_t { k32F = 68, k32FFastTF32 = 77 };  // cublasComputeType_t

// One matrix as cuBLASLt sees it: column-major, `rows` x `cols` as stored, column stride `ld`.
struct LtMatrix {
  const void* ptr = nullptr;
  LtType type = LtType::kF32;
  int64_t rows = 0, cols = 0, ld = 0;
};

// Everything one cublasLtMatmul call needs; D = alpha · op(A) · op(B) + beta · C, C and D the
// same buffer here (in-place accumulation; when beta == 0, cuBLASLt does not read C).
struct LtProblem {
  LtOp transa = LtOp::kN, transb = LtOp::kN;
  int64_t m = 0, n = 0, k = 0;  // op(A) (m, k), op(B) (k, n), D (m, n)
  LtMatrix A, B, C, D;
  LtCompute compute = LtCompute::k32F;
  LtType scale_type = LtType::kF32;  // alpha and beta are fp32 host values
  float alpha = 1.0f, beta = 0.0f;
};

// Which product of a linear layer.
enum class LinearGemm { kForward, kBackwardData, kBackwardWeight };

// One linear-layer product in ft's terms (kernels.h linear_forward / linear_backward):
//   kForward:        out_ptr = y  (N, out), a = x (N, in),    b = W (out, in)
//   kBackwardData:   out_ptr = dx (N, in),  a = dy (N, out),  b = W (out, in)
//   kBackwardWeight: out_ptr = dW (out, in) fp32, a = dy (N, out), b = x (N, in); always +=
// `dtype` is the element type of x, W, dy and of y / dx (fp32, bf16 or fp16); products sum in
// fp32. `allow_tf32` (runtime.tf32) lets fp32 GEMMs round their inputs to TF32; it does
// nothing for 16-bit inputs.
struct LinearCall {
  LinearGemm gemm = LinearGemm::kForward;
  DType dtype = DType::kF32;
  void* out_ptr = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  int N = 0, in = 0, out = 0;
  bool accumulate = false;  // y / dx (+)=; ignored for kBackwardWeight (always +=)
  bool allow_tf32 = false;
};

// The cuBLASLt problem for `call`. Throws ft::Error for a dtype cuBLASLt is not given here
// or a negative size.
LtProblem map_linear(const LinearCall& call);

// "forward bf16 N=19 in=111 out=1 (m=1 n=19 k=111, transa=T transb=N, beta=1)": for errors.
std::string describe(const LinearCall& call, const LtProblem& p);

}  // namespace ft::cuda
