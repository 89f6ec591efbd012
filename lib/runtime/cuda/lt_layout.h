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

// One matrix as cuBLASLt sees it: column-major, `rows` x `cols` as stored, column stride `ld`;
// with `batch` > 1, matrix i of the batch starts `batch_stride` elements after matrix i - 1.
struct LtMatrix {
  const void* ptr = nullptr;
  LtType type = LtType::kF32;
  int64_t rows = 0, cols = 0, ld = 0;
  int32_t batch = 1;
  int64_t batch_stride = 0;
};

// Everything one cublasLtMatmul call needs; D = alpha · op(A) · op(B) + beta · C. C has D's layout
// and is D's buffer (in-place accumulation) unless the call names another to read (a residual,
// out of place); when beta == 0, cuBLASLt does not read C.
struct LtProblem {
  LtOp transa = LtOp::kN, transb = LtOp::kN;
  int64_t m = 0, n = 0, k = 0;  // op(A) (m, k), op(B) (k, n), D (m, n)
  LtMatrix A, B, C, D;
  LtCompute compute = LtCompute::k32F;
  LtType scale_type = LtType::kF32;  // alpha and beta are fp32 host values
  float alpha = 1.0f, beta = 0.0f;
};

// A strided-batched GEMM in ft's row-major terms, the general form every product here maps
// through (map_linear below is one use, attention's score and value products the other):
//   for i < batch:  C_i (M, N) = alpha · op(A_i) · op(B_i) + beta · C_i
// A_i is stored (M, K) row-major with row stride lda, or (K, M) when trans_a (op = transpose);
// B_i likewise (K, N), or (N, K) when trans_b. X_i starts stride_x elements after X_{i-1}.
// A and B have element type `in`; C has `out`, which is `in` or fp32. Products sum in fp32;
// `allow_tf32` lets fp32 inputs round to TF32. `what` names the product in errors.
struct GemmCall {
  DType in = DType::kF32, out = DType::kF32;
  int64_t M = 0, N = 0, K = 0;
  int32_t batch = 1;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  bool trans_a = false;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  bool trans_b = false;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  // Where beta's C is read when it is not `c` itself (out of place: C_i (M, N) = alpha · op(A_i) ·
  // op(B_i) + beta · c_source_i, with c's layout): null reads c (in place). Disjoint from c.
  const void* c_source = nullptr;
  float alpha = 1.0f, beta = 0.0f;
  bool allow_tf32 = false;
  const char* what = "gemm";
};

// The cuBLASLt problem for `g`: row-major C is column-major Cᵀ = op(B)ᵀ · op(A)ᵀ, and a stored
// row-major matrix read column-major is its transpose, so B's storage becomes cuBLASLt's A
// (transposed iff trans_b) and A's storage its B (transposed iff trans_a); m = N, n = M, k = K.
// Throws ft::Error for a non-compute dtype, an output type that is neither `in` nor fp32, a
// negative size, an ld shorter than its row, or batch < 1.
LtProblem map_gemm(const GemmCall& g);

// "attention scores bf16 -> f32 M=7 N=19 K=64 batch=4 (lda=..., ...)": for errors.
std::string describe(const GemmCall& g);

// Which product of a linear layer.
enum class LinearGemm { kForward, kBackwardData, kBackwardWeight };

// One linear-layer product in ft's terms (kernels.h linear_forward / linear_backward):
//   kForward:        out_ptr = y  (N, out), a = x (N, in),    b = W (out, in)
//   kBackwardData:   out_ptr = dx (N, in),  a = dy (N, out),  b = W (out, in)
//   kBackwardWeight: out_ptr = dW (out, in) fp32, a = dy (N, out), b = x (N, in); always +=
// A forward product that accumulates may read its old output from `residual` instead of y
// (y = residual + x · Wᵀ, cuBLASLt's C != D): kernels.h linear_forward_residual.
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
  bool accumulate = false;         // y / dx (+)=; ignored for kBackwardWeight (always +=)
  const void* residual = nullptr;  // kForward with accumulate: the (N, out) added (null: y itself)
  bool allow_tf32 = false;
};

// The product of `call` as a GemmCall (unbatched, row-major, lds the row lengths).
GemmCall linear_gemm(const LinearCall& call);

// map_gemm(linear_gemm(call)). Throws ft::Error for a dtype cuBLASLt is not given here or a
// negative size.
LtProblem map_linear(const LinearCall& call);

// "forward bf16 N=19 in=111 out=1 (m=1 n=19 k=111, transa=T transb=N, beta=1)": for errors.
std::string describe(const LinearCall& call, const LtProblem& p);

}  // namespace ft::cuda
